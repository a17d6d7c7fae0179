"""VMM and legacy IPC sharing between two processes through NVIDIA's raw cuda.bindings: a
POSIX-FD VMM allocation exported, sent to another process (SCM_RIGHTS), imported and mapped
there; cuMemAlloc memory shared by cuIpcGetMemHandle / cuIpcOpenMemHandle. Each side sees the
other's bytes. Runs on fakecuda alone and under the shim (where the FD is a ticket and the IPC
handle the shim's own)."""

import ctypes
import multiprocessing
import os
from multiprocessing import reduction

from cuda.bindings import driver as cu

import sharing_peer
from conftest import check
from sharing_peer import holds, vmm_map

MIB = 1 << 20


def vmm_allocation(size):
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    prop.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    option = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
    granularity = check(cu.cuMemGetAllocationGranularity(prop, option))
    size = (size + granularity - 1) // granularity * granularity
    return check(cu.cuMemCreate(size, prop, 0)), size


def test_vmm_and_legacy_ipc_memory_are_shared_with_another_process(context):
    context_spawn = multiprocessing.get_context("spawn")
    pipe, theirs = context_spawn.Pipe()
    peer = context_spawn.Process(target=sharing_peer.run, args=(theirs,))
    peer.start()
    try:
        # VMM: export the allocation as a POSIX FD and send the descriptor.
        handle, size = vmm_allocation(3 * MIB)
        address = vmm_map(handle, size)
        check(cu.cuMemsetD8(address, 21, size))
        posix = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        fd = check(cu.cuMemExportToShareableHandle(handle, posix, 0))
        pipe.send(("vmm", size, 21))
        reduction.send_handle(pipe, fd, peer.pid)
        os.close(fd)
        assert pipe.poll(60) and pipe.recv() == ("vmm", True), "the importer saw the bytes"
        assert holds(address, 22, size), "the creator sees the importer's write"

        # Legacy IPC: cuMemAlloc memory and its 64-byte handle.
        dptr = check(cu.cuMemAlloc(MIB))
        check(cu.cuMemsetD8(dptr, 31, MIB))
        ipc = check(cu.cuIpcGetMemHandle(dptr))
        pipe.send(("ipc", ctypes.string_at(ipc.getPtr(), 64), MIB, 31))
        assert pipe.poll(60) and pipe.recv() == ("ipc", True), "the opener saw the bytes"
        assert holds(dptr, 32, MIB), "the creator sees the opener's write"

        pipe.send(("quit",))
        assert pipe.poll(60) and pipe.recv() == ("bye",)
        peer.join(60)
        assert peer.exitcode == 0
        check(cu.cuMemFree(dptr))
        check(cu.cuMemUnmap(address, size))
        check(cu.cuMemAddressFree(address, size))
        check(cu.cuMemRelease(handle))
    finally:
        if peer.is_alive():
            peer.kill()
