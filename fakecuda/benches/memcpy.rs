//! Throughput of fakecuda's cuMemcpyHtoD/DtoH against plain memcpy of the same bytes, in one
//! run; prints the ratios.

#[path = "../tests/support/mod.rs"]
mod support;

use criterion::{Criterion, Throughput};
use std::time::{Duration, Instant};
use support::*;

const SIZE: usize = 64 << 20;

fn time(mut f: impl FnMut(), iters: u32) -> Duration {
    f();
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    start.elapsed() / iters
}

fn main() {
    let cu = cuda();
    cu.setup(0);
    let h = cu.create(SIZE, 0, 0);
    let dev = cu.map_rw(h, SIZE, 0);
    let src = pattern(3, SIZE);
    let mut dst = vec![0u8; SIZE];
    let mut plain = vec![0u8; SIZE];

    let mut c = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    let mut g = c.benchmark_group("memcpy_64MiB");
    g.throughput(Throughput::Bytes(SIZE as u64));
    g.bench_function("cuMemcpyHtoD", |b| {
        b.iter(|| ok(cu.cuMemcpyHtoD_v2(dev, src.as_ptr().cast(), SIZE)))
    });
    g.bench_function("cuMemcpyDtoH", |b| {
        b.iter(|| ok(cu.cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), dev, SIZE)))
    });
    g.bench_function("plain_memcpy", |b| {
        b.iter(|| plain.copy_from_slice(std::hint::black_box(&src)))
    });
    g.finish();

    // Criterion's report is per function; the ratio is the figure that matters here.
    let iters = 20;
    let htod = time(
        || ok(cu.cuMemcpyHtoD_v2(dev, src.as_ptr().cast(), SIZE)),
        iters,
    );
    let dtoh = time(
        || ok(cu.cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), dev, SIZE)),
        iters,
    );
    let base = time(|| plain.copy_from_slice(std::hint::black_box(&src)), iters);
    let gbs = |d: Duration| SIZE as f64 / d.as_secs_f64() / 1e9;
    println!(
        "64 MiB: plain memcpy {:.2} GB/s, cuMemcpyHtoD {:.2} GB/s, cuMemcpyDtoH {:.2} GB/s",
        gbs(base),
        gbs(htod),
        gbs(dtoh)
    );
    println!(
        "ratio (fakecuda time / memcpy time): HtoD {:.2}, DtoH {:.2}",
        htod.as_secs_f64() / base.as_secs_f64(),
        dtoh.as_secs_f64() / base.as_secs_f64()
    );
    ok(cu.cuMemUnmap(dev, SIZE));
    ok(cu.cuMemAddressFree(dev, SIZE));
    ok(cu.cuMemRelease(h));
    c.final_summary();
}
