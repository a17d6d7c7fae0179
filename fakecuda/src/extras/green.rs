//! Green contexts: a context restricted to a set of a device's SMs, made from a resource
//! descriptor (`cuDevResourceGenerateDesc` over SM groups a split gave). It is a created
//! context no thread has current until the application sets it; its streams are made through
//! it. Nothing runs on SMs here, so the restriction is kept and reported, not enforced.

use crate::driver::DriverState;
use crate::error::{CuError, CuResult};
use crate::state::extras::green::DEVICE_SMS;

impl DriverState {
    /// `cuDevResourceGenerateDesc`: the SM groups `sms` (one or more) make a descriptor.
    pub fn green_desc(&mut self, sms: &[u32]) -> CuResult<u64> {
        let total: u32 = sms.iter().sum();
        if sms.is_empty() || total == 0 || total > DEVICE_SMS {
            return Err(CuError::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
        }
        let h = self.next_handle();
        self.greens.descs.insert(h, total);
        Ok(h)
    }

    /// `cuGreenCtxCreate`: a context of `device` with the descriptor's SMs, not made current.
    pub fn green_create(&mut self, desc: u64, device: i32) -> CuResult<u64> {
        let dev = self.config.check_device(device)?;
        let sms = *self
            .greens
            .descs
            .get(&desc)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let ctx = self.next_handle();
        self.contexts.create_detached(ctx, dev);
        let green = self.next_handle();
        self.greens.contexts.insert(green, (ctx, sms));
        Ok(green)
    }

    /// A green context's context.
    pub fn green_ctx(&self, green: u64) -> CuResult<u64> {
        self.greens
            .contexts
            .get(&green)
            .map(|(ctx, _)| *ctx)
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)
    }

    /// `cuGreenCtxDestroy`: its context and streams go.
    pub fn green_destroy(&mut self, green: u64) -> CuResult<()> {
        let ctx = self.green_ctx(green)?;
        self.greens.contexts.remove(&green);
        self.contexts.destroy(ctx)
    }

    /// The green context whose context `ctx` is, if any.
    pub fn green_of(&self, ctx: u64) -> Option<u64> {
        self.greens
            .contexts
            .iter()
            .find(|(_, (c, _))| *c == ctx)
            .map(|(g, _)| *g)
    }

    /// The SMs context `ctx` may use: a green context's share, else the device's.
    pub fn ctx_sms(&self, ctx: u64) -> u32 {
        self.greens
            .contexts
            .values()
            .find(|(c, _)| *c == ctx)
            .map_or(DEVICE_SMS, |(_, sms)| *sms)
    }
}
