"""Memory-pool IPC through NVIDIA's raw `cuda.bindings` driver API under the shim: several pools
in one process, a process importing from two creators, pointers freed before, between and after
toggles, pool attributes kept, bad pointer imports refused, stream order kept by an async free,
and no descriptor, pool or allocation left behind. Run by `clients/tests/python.rs` with the
shim preloaded (see test_pool_sharing.py)."""

import contextlib
import ctypes
import multiprocessing
import os
import threading
import time

import pytest
from cuda.bindings import driver

import driver_peer
from driver_peer import check, holds
from test_peer_toggle import device_grants
from test_pool_sharing import cuinterpose

MIB = 1 << 20
R = driver.CUresult
ATTR = driver.CUmemPool_attribute


@pytest.fixture(scope="module")
def ctx():
    assert "libcuinterpose" in os.environ.get("LD_PRELOAD", ""), "run under the shim"
    multiprocessing.set_start_method("spawn", force=True)
    # Python's own helper (one pipe for the life of the process) before any count.
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    return driver_peer.context()


# Every peer a test started, for `no_peer_outlives_its_test`.
STARTED = []


@pytest.fixture(autouse=True)
def no_peer_outlives_its_test():
    # A failed test never says quit to its peers: ended here, they cannot join the next
    # test's checkpoints as participants it does not expect.
    yield
    while STARTED:
        process = STARTED.pop()
        if process.is_alive():
            process.kill()
            process.join(10)


class Peer:
    """A driver_peer process and its pipe."""

    def __init__(self, visible=None, context_first=True):
        """`visible`: the peer's CUDA_VISIBLE_DEVICES (the test process's own by default)."""
        context = multiprocessing.get_context("spawn")
        self.pipe, theirs = context.Pipe()
        # Daemonic: a failed test that never says quit must not hang the suite at exit.
        self.process = context.Process(
            target=driver_peer.run, args=(theirs, context_first, visible), daemon=True
        )
        self.process.start()
        STARTED.append(self.process)

    def ask(self, *command):
        self.pipe.send(command)
        assert self.pipe.poll(60), f"the peer did not answer {command[0]}"
        return self.pipe.recv()

    def send_pool(self, name, fd):
        self.pipe.send(("import_pool", name))
        multiprocessing.reduction.send_handle(self.pipe, fd, self.process.pid)
        assert self.pipe.poll(60) and self.pipe.recv() == ("imported", name)

    def receive_pool(self, name):
        self.pipe.send(("create_pool", name))
        fd = multiprocessing.reduction.recv_handle(self.pipe)
        assert self.pipe.recv() == ("created", name)
        return fd

    def finish(self):
        assert self.ask("quit") == ("bye",)
        self.process.join(60)
        assert self.process.exitcode == 0
        self.pipe.close()
        STARTED.remove(self.process)
        self.process.close()


def alloc(pool, size, value, stream):
    address = check(driver.cuMemAllocFromPoolAsync(size, pool, stream))
    check(driver.cuMemsetD8Async(address, value, size, stream))
    check(driver.cuStreamSynchronize(stream))
    return int(address), driver_peer.export_bytes(check(driver.cuMemPoolExportPointer(address)))


@contextlib.contextmanager
def creator_pool():
    """A fresh IPC pool of this process, a stream, and the list of allocations to free: on the
    way out (after a failure too, so the pool does not stay shared into the next tests) they
    are freed and the pool and the stream destroyed."""
    stream = check(driver.cuStreamCreate(0))
    pool = driver_peer.ipc_pool()
    allocated = []
    try:
        yield pool, stream, allocated
    finally:
        for address in allocated:
            check(driver.cuMemFreeAsync(address, stream))
        check(driver.cuStreamSynchronize(stream))
        check(driver.cuMemPoolDestroy(pool))
        check(driver.cuStreamDestroy(stream))


def fd_targets():
    targets = []
    for f in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{f}"))
        except OSError:
            pass
    return sorted(targets)


def test_pools_of_two_creators_shared_with_one_importer_survive_toggles(ctx):
    fds_before = fd_targets()
    free_before, _ = check(driver.cuMemGetInfo())
    stream = check(driver.cuStreamCreate(0))
    # Two pools here, one in a second creator; the importer takes all three.
    first, second = driver_peer.ipc_pool(), driver_peer.ipc_pool(max_size=16 * MIB)
    check(driver.cuMemPoolSetAttribute(first, ATTR.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, driver.cuuint64_t(MIB)))
    check(driver.cuMemPoolSetAttribute(first, ATTR.CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, 0))
    # Device 1 may read the first pool's memory (fakecuda has two devices).
    peer = driver.CUmemAccessDesc()
    peer.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    peer.location.id = 1
    peer.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ
    check(driver.cuMemPoolSetAccess(first, [peer], 1))
    other, importer = Peer(), Peer()
    importer_fds = importer.ask("fds")[1]
    other_fds = other.ask("fds")[1]
    for name, pool in (("first", first), ("second", second)):
        fd = driver_peer.export_pool(pool)
        importer.send_pool(name, fd)
        os.close(fd)
    fd = other.receive_pool("third")
    importer.send_pool("third", fd)
    os.close(fd)

    # Freed before any checkpoint.
    early, _ = alloc(first, MIB, 1, stream)
    check(driver.cuMemFreeAsync(early, stream))
    mine = {"a": (first, 2 * MIB, 11), "b": (second, 3 * MIB, 12), "c": (first, MIB, 13)}
    addresses, sizes, expected, mapped = {}, {}, {}, {}
    for key, (pool, size, value) in mine.items():
        addresses[key], exported = alloc(pool, size, value, stream)
        name = "first" if pool is first else "second"
        reply = importer.ask("import_ptr", name, key, exported, size)
        assert reply[:2] == ("mapped", key)
        sizes[key], expected[key], mapped[key] = size, value, (reply[2], exported)
    # The same pointer imported again: the same address, and one free of it leaves the other.
    again = importer.ask("import_ptr", "first", "a-again", mapped["a"][1], sizes["a"])
    assert again == ("mapped", "a-again", mapped["a"][0])
    assert importer.ask("free", "a-again") == ("freed", "a-again")
    _, key, exported = other.ask("alloc", "third", "t", 2 * MIB, 14)
    assert importer.ask("import_ptr", "third", "t", exported, 2 * MIB)[:2] == ("mapped", "t")
    expected["t"] = 14
    # A pointer of one pool is refused by another pool's import, and so are foreign bytes.
    assert importer.ask("import_ptr", "first", "wrong", exported, 2 * MIB)[0] == "refused"
    assert importer.ask("import_ptr", "first", "junk", bytes(64), MIB)[0] == "refused"
    # Only the creator allocates from its pool: an importer's pool handle cannot.
    assert importer.ask("alloc", "first", "x", MIB, 1)[0] == "refused"
    assert importer.ask("check", expected)[1] == {k: True for k in expected}

    inspection = cuinterpose("inspect")
    assert inspection["valid"], inspection
    assert inspection["summary"]["participants"] == 3, inspection
    assert inspection["summary"]["shared_allocations"] == 4, inspection
    # The pools are records too: two here and one in the second creator, the importer's three
    # imports naming those creators; every allocation named with its pool.
    records = {pid: p["records"] for pid, p in inspection["participants"].items()}
    pools = {pid: [r for r in rs if r["kind"] == "pool"] for pid, rs in records.items()}
    members = {pid: [r for r in rs if r["kind"] == "pool_member"] for pid, rs in records.items()}
    me, theirs = str(os.getpid()), str(other.process.pid)
    mine_pid = int(me)
    assert len(pools[me]) == 2 and all(p["pool"]["creator_pid"] == mine_pid for p in pools[me])
    assert len(pools[theirs]) == 1
    importer_pools = pools[str(importer.process.pid)]
    assert sorted(p["pool"]["creator_pid"] for p in importer_pools) == sorted(
        [mine_pid, mine_pid, int(theirs)]
    ), importer_pools
    assert [len(members[pid]) for pid in (me, theirs, str(importer.process.pid))] == [3, 1, 4]
    first_record = [p for p in pools[me] if p["release_threshold"] == MIB]
    assert len(first_record) == 1, pools[me]
    # Devices by ordinal, each with the UUID this process lists for it beside it.
    gpus = {d["ordinal"]: d["uuid"] for d in inspection["participants"][me]["devices"]}
    assert first_record[0]["access"] == [
        {"flags": "read", "location": {"id": 1, "type": "device", "uuid": gpus[1]}}
    ]
    assert (first_record[0]["device"], first_record[0]["device_uuid"]) == (0, gpus[0])

    for round_ in range(2):
        report = cuinterpose("toggle", "--pid", str(os.getpid()))
        assert report["command"] == "toggle", report
        for key in mine:
            if key in expected:
                assert holds(addresses[key], expected[key], sizes[key]), (round_, key)
        assert importer.ask("check", expected)[1] == {k: True for k in expected}
        assert other.ask("check", {"t": expected["t"]})[1] == {"t": True}
        # Still shared both ways.
        for key in ("a", "t"):
            expected[key] = 40 + round_ * 2 + (key == "t")
            assert importer.ask("write", key, expected[key]) == ("wrote", key)
        assert holds(addresses["a"], expected["a"], sizes["a"])
        assert other.ask("check", {"t": expected["t"]})[1] == {"t": True}
        # The pool's attributes came through.
        threshold = check(driver.cuMemPoolGetAttribute(first, ATTR.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD))
        assert int(threshold) == MIB
        assert check(driver.cuMemPoolGetAttribute(first, ATTR.CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC)) == 0
        location = driver.CUmemLocation()
        location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        location.id = 0
        flags = check(driver.cuMemPoolGetAccess(first, location))
        assert flags == driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        location.id = 1
        flags = check(driver.cuMemPoolGetAccess(first, location))
        assert flags == driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ
        if round_ == 0:
            # Freed between the toggles (importer first), and one allocated after a restore.
            assert importer.ask("free", "c") == ("freed", "c")
            check(driver.cuMemFreeAsync(addresses.pop("c"), stream))
            del expected["c"], mine["c"]
            addresses["d"], exported = alloc(second, MIB, 15, stream)
            assert importer.ask("import_ptr", "second", "d", exported, MIB)[:2] == ("mapped", "d")
            mine["d"], sizes["d"], expected["d"] = (second, MIB, 15), MIB, 15
    used = check(driver.cuMemPoolGetAttribute(second, ATTR.CU_MEMPOOL_ATTR_USED_MEM_CURRENT))
    assert int(used) >= 4 * MIB

    # Teardown: the importer lets go first, then the creators; nothing is left.
    _, importer_at_end = importer.ask("release")
    _, other_at_end = other.ask("release")
    importer.finish()
    other.finish()
    for key in list(addresses):
        check(driver.cuMemFreeAsync(addresses.pop(key), stream))
    check(driver.cuStreamSynchronize(stream))
    assert int(check(driver.cuMemPoolGetAttribute(second, ATTR.CU_MEMPOOL_ATTR_USED_MEM_CURRENT))) == 0
    check(driver.cuMemPoolDestroy(first))
    check(driver.cuMemPoolDestroy(second))
    assert driver.cuMemPoolDestroy(second)[0] == R.CUDA_ERROR_INVALID_VALUE
    check(driver.cuStreamDestroy(stream))
    # Once everything is freed, three imported pools and five imported pointers left no
    # descriptor behind in the importer, nor did the second creator's pool and allocation.
    assert importer_at_end == importer_fds, (importer_fds, importer_at_end)
    assert other_at_end == other_fds, (other_fds, other_at_end)
    assert fd_targets() == fds_before
    free_after, _ = check(driver.cuMemGetInfo())
    assert int(free_after) == int(free_before), "every pool allocation was released"
    after = cuinterpose("inspect")
    assert after["summary"]["shared_allocations"] == 0, after
    # No pool and no pool allocation is left on record either.
    left = after["participants"][str(os.getpid())]["records"]
    assert not [r for r in left if r["kind"] in ("pool", "pool_member")], left


def test_an_async_free_waits_for_the_work_queued_before_it(ctx):
    stream = check(driver.cuStreamCreate(0))
    pool = driver_peer.ipc_pool()
    address, _ = alloc(pool, MIB, 3, stream)
    done = threading.Event()

    @ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    def slow(_):
        time.sleep(0.3)
        done.set()

    check(driver.cuLaunchHostFunc(stream, driver.CUhostFn(ctypes.cast(slow, ctypes.c_void_p).value), 0))
    check(driver.cuMemsetD8Async(address, 4, MIB, stream))
    check(driver.cuMemFreeAsync(address, stream))
    # The free went after the queued work: by the time it returned, that work had run.
    assert done.is_set()
    assert driver.cuMemcpyDtoH(bytearray(16), address, 16)[0] != R.CUDA_SUCCESS
    check(driver.cuMemPoolDestroy(pool))
    check(driver.cuStreamDestroy(stream))


def test_a_current_ipc_pool_serves_alloc_async(ctx):
    stream = check(driver.cuStreamCreate(0))
    device = check(driver.cuDeviceGet(0))
    default = check(driver.cuDeviceGetDefaultMemPool(device))
    pool = driver_peer.ipc_pool()
    check(driver.cuDeviceSetMemPool(device, pool))
    assert int(check(driver.cuDeviceGetMemPool(device))) == int(pool)
    address = check(driver.cuMemAllocAsync(MIB, stream))
    check(driver.cuMemsetD8Async(address, 5, MIB, stream))
    check(driver.cuStreamSynchronize(stream))
    assert holds(int(address), 5, MIB)
    attribute = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE
    assert int(check(driver.cuPointerGetAttribute(attribute, address))) == int(pool)
    assert int(check(driver.cuMemPoolGetAttribute(pool, ATTR.CU_MEMPOOL_ATTR_USED_MEM_CURRENT))) >= MIB
    # It can be exported like any allocation of the pool.
    assert len(driver_peer.export_bytes(check(driver.cuMemPoolExportPointer(address)))) == 64
    check(driver.cuMemFreeAsync(address, stream))
    check(driver.cuStreamSynchronize(stream))
    # Back to the driver's own pool: cuMemAllocAsync is the driver's again.
    check(driver.cuDeviceSetMemPool(device, default))
    assert int(check(driver.cuDeviceGetMemPool(device))) == int(default)
    plain = check(driver.cuMemAllocAsync(MIB, stream))
    assert int(check(driver.cuPointerGetAttribute(attribute, plain))) == int(default)
    check(driver.cuMemFreeAsync(plain, stream))
    check(driver.cuStreamSynchronize(stream))
    check(driver.cuMemPoolDestroy(pool))
    check(driver.cuStreamDestroy(stream))


@pytest.mark.parametrize("context_first", [False, True], ids=["no_context", "other_gpu_current"])
def test_an_imported_pool_takes_its_gpu_by_the_importers_ordinal(ctx, context_first):
    # The importer sees the machine's GPUs as 1,0: this process's device 0 (machine GPU 0) is
    # its device 1. It imports the pool with no context current (as cuda-core unpickles one)
    # or with its device 0 (machine GPU 1) current, then makes its device 1 current and
    # imports a pointer: the pool's device is the GPU its memory is on, by the importer's own
    # ordinal, not the creator's ordinal 0 nor the device current at the import.
    with creator_pool() as (pool, stream, allocated):
        importer = Peer(visible="1,0", context_first=context_first)
        fd = driver_peer.export_pool(pool)
        importer.send_pool("pool", fd)
        os.close(fd)
        assert importer.ask("context", 1) == ("current", 1)
        address, exported = alloc(pool, MIB, 31, stream)
        allocated.append(address)
        assert importer.ask("import_ptr", "pool", "p", exported, MIB)[:2] == ("mapped", "p")
        flags = driver.CUmemAccess_flags
        own = int(flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        other = int(flags.CU_MEM_ACCESS_FLAGS_PROT_NONE)
        assert importer.ask("pool_access", "pool", 1) == ("access", own)
        assert importer.ask("pool_access", "pool", 0) == ("access", other)

        inspection = cuinterpose("inspect")
        assert inspection["valid"], inspection
        me, theirs = str(os.getpid()), str(importer.process.pid)
        gpu0 = {d["ordinal"]: d["uuid"] for d in inspection["participants"][me]["devices"]}[0]
        imported = [r for r in inspection["participants"][theirs]["records"] if r["kind"] == "pool"]
        assert [(r["device"], r["device_uuid"]) for r in imported] == [(1, gpu0)], imported

        cuinterpose("toggle", "--pid", str(os.getpid()))
        assert importer.ask("check", {"p": 31})[1] == {"p": True}
        assert importer.ask("write", "p", 32) == ("wrote", "p")
        assert holds(address, 32, MIB)
        assert importer.ask("pool_access", "pool", 1) == ("access", own)
        importer.ask("release")
        importer.finish()


def test_a_pointer_imported_after_set_access_gets_the_pools_access(ctx):
    # cuMemPoolSetAccess covers the pool's allocations to come: in an importer, the pointers it
    # imports later are granted too, and the grant is kept across a toggle.
    with creator_pool() as (pool, stream, allocated):
        importer = Peer()
        fd = driver_peer.export_pool(pool)
        importer.send_pool("pool", fd)
        os.close(fd)
        read = int(driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ)
        assert importer.ask("set_access", "pool", 1, read) == ("granted", "pool")
        address, exported = alloc(pool, MIB, 41, stream)
        allocated.append(address)
        reply = importer.ask("import_ptr", "pool", "p", exported, MIB)
        assert reply[:2] == ("mapped", "p"), reply
        pid = importer.process.pid
        for when in ("before", "after"):
            inspection = cuinterpose("inspect")
            assert device_grants(inspection, reply[2], pid) == [0, 1], (when, inspection)
            # The creator's own grants are its own: none here.
            assert device_grants(inspection, address) == [0], when
            if when == "before":
                cuinterpose("toggle", "--pid", str(os.getpid()))
        assert importer.ask("check", {"p": 41})[1] == {"p": True}
        importer.ask("release")
        importer.finish()
