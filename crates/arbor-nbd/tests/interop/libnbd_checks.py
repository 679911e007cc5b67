"""Checks run with Debian's python3-libnbd against the server under test.

Usage: /usr/bin/python3 libnbd_checks.py CHECK SOCKET
Each check raises (non-zero exit) on failure.
"""
import errno
import sys

import nbd

MIB = 1024 * 1024


def connect(socket, export, structured=True, meta=True):
    h = nbd.NBD()
    h.set_export_name(export)
    h.set_request_structured_replies(structured)
    if meta:
        h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.connect_unix(socket)
    return h


def expect_error(expected, function, *args, **kwargs):
    try:
        function(*args, **kwargs)
    except nbd.Error as error:
        assert error.errnum == expected, (
            f"{function.__name__}{args}: errno {error.errnum} ({error.string}), "
            f"wanted {errno.errorcode[expected]}")
        return error
    raise AssertionError(f"{function.__name__}{args} succeeded, wanted {errno.errorcode[expected]}")


def extents(h, length, offset, flags=0):
    found = []

    def callback(metacontext, offset, entries, err):
        assert metacontext == nbd.CONTEXT_BASE_ALLOCATION
        found.extend(zip(entries[0::2], entries[1::2]))

    h.block_status(length, offset, callback, flags)
    return found


def check_commands(socket):
    h = connect(socket, "vol")
    assert h.get_structured_replies_negotiated()
    assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.pwrite(b"\x11" * MIB, 0)
    h.pwrite(b"\x22" * 4096, MIB, nbd.CMD_FLAG_FUA)
    assert h.pread(MIB, 0) == b"\x11" * MIB
    assert h.pread_structured(4096, MIB, lambda *chunk: 0, nbd.CMD_FLAG_DF) == b"\x22" * 4096
    h.flush()
    h.cache(MIB, 0)

    # Trim a written MiB: block status and reads see a zeroed hole.
    h.trim(512 * 1024, 512 * 1024)  # count, offset (libnbd's order)
    assert extents(h, 2 * MIB, 0)[:2] == [
        (512 * 1024, 0), (512 * 1024, nbd.STATE_HOLE | nbd.STATE_ZERO)], extents(h, 2 * MIB, 0)
    assert h.pread(512 * 1024, 512 * 1024) == b"\x00" * (512 * 1024)
    assert h.pread(4096, 512 * 1024 - 4096) == b"\x11" * 4096
    # REQ_ONE: exactly one extent, no longer than asked.
    assert extents(h, 4096, 0, nbd.CMD_FLAG_REQ_ONE) == [(4096, 0)]

    # A structured read of a mostly-hole range, with and without DF.
    h.pwrite(b"\x33" * 4096, 3 * MIB)
    chunks = []

    def on_chunk(buf, offset, status, err):
        chunks.append((offset, len(buf), status))
        return 0

    whole = h.pread_structured(MIB, 3 * MIB - 512 * 1024, on_chunk)
    assert whole == b"\x00" * (512 * 1024) + b"\x33" * 4096 + b"\x00" * (512 * 1024 - 4096)
    kinds = {status for _, _, status in chunks}
    assert kinds == {nbd.READ_DATA, nbd.READ_HOLE}, chunks
    chunks.clear()
    assert h.pread_structured(MIB, 3 * MIB - 512 * 1024, on_chunk, nbd.CMD_FLAG_DF) == whole
    assert [status for _, _, status in chunks] == [nbd.READ_DATA], chunks

    # Write zeroes: may punch holes; NO_HOLE provisions; FAST_ZERO only
    # when it is fast (deallocating), else ENOTSUP and nothing changes.
    h.zero(MIB, 3 * MIB)
    assert h.pread(4096, 3 * MIB) == b"\x00" * 4096
    h.pwrite(b"\x44" * 4096, 4 * MIB)
    expect_error(errno.ENOTSUP, h.zero, 4096, 4 * MIB, nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_NO_HOLE)
    assert h.pread(4096, 4 * MIB) == b"\x44" * 4096
    h.zero(4096, 4 * MIB, nbd.CMD_FLAG_NO_HOLE | nbd.CMD_FLAG_FUA)
    assert extents(h, 4096, 4 * MIB) == [(4096, 0)]
    h.zero(4096, 4 * MIB, nbd.CMD_FLAG_FAST_ZERO)
    assert extents(h, 4096, 4 * MIB) == [(4096, nbd.STATE_HOLE | nbd.STATE_ZERO)]
    h.shutdown()


def check_simple_replies(socket):
    h = connect(socket, "vol", structured=False, meta=False)
    assert not h.get_structured_replies_negotiated()
    assert not h.can_df()
    h.pwrite(b"\x55" * 8192, 8192)
    assert h.pread(8192, 8192) == b"\x55" * 8192
    expect_error(errno.EINVAL, h.pread, 512, h.get_size())
    h.shutdown()


def check_error_cases(socket):
    h = connect(socket, "vol")
    h.set_strict_mode(0)  # let invalid requests reach the server
    size = h.get_size()
    expect_error(errno.EINVAL, h.pread, 4096, size - 512)
    expect_error(errno.ENOSPC, h.pwrite, b"x" * 4096, size - 512)
    expect_error(errno.ENOSPC, h.zero, 4096, size)
    expect_error(errno.EINVAL, h.trim, 4096, size)
    expect_error(errno.EINVAL, h.pread, 512, 100)
    expect_error(errno.EINVAL, h.pwrite, b"x" * 100, 0)
    # A trim is advisory: an unaligned one is served on its whole sectors
    # (none in the first, one in the second).
    h.trim(100, 0)
    h.trim(1000, 100)
    # Oversized: a read gets EOVERFLOW (structured), a write's payload is
    # consumed and refused; the connection stays in sync either way.
    big = 32 * MIB + 512
    expect_error(errno.EOVERFLOW, h.pread, big, 0)
    expect_error(errno.EINVAL, h.pwrite, b"\x01" * big, 0)
    h.pwrite(b"\x02" * 512, 0)
    assert h.pread(512, 0) == b"\x02" * 512
    # Flags not valid for the command.
    expect_error(errno.EINVAL, h.pwrite, b"x" * 512, 0, nbd.CMD_FLAG_DF)
    expect_error(errno.EINVAL, h.flush, nbd.CMD_FLAG_NO_HOLE)
    # Payload-free commands may exceed the maximum payload.
    h.zero(64 * MIB, 0)
    h.shutdown()


def check_oversized_simple_read(socket):
    h = connect(socket, "vol", structured=False, meta=False)
    h.set_strict_mode(0)
    expect_error(errno.EINVAL, h.pread, 32 * MIB + 512, 0)
    assert len(h.pread(512, 0)) == 512
    h.shutdown()


def check_read_only(socket):
    h = connect(socket, "snap")
    assert h.is_read_only()
    h.set_strict_mode(0)
    expect_error(errno.EPERM, h.pwrite, b"x" * 512, 0)
    expect_error(errno.EPERM, h.trim, 512, 0)
    expect_error(errno.EPERM, h.zero, 512, 0)
    h.flush()
    assert h.pread(512, 0) == b"\x00" * 512
    h.shutdown()


def check_pool_full(socket):
    h = connect(socket, "tiny-pool")
    h.pwrite(b"\x01" * 8192, 0)
    expect_error(errno.ENOSPC, h.pwrite, b"\x01" * 8192, MIB)
    h.pwrite(b"\x02" * 8192, 0)  # overwriting allocated space still works
    h.shutdown()


def check_export_gone(socket):
    h = connect(socket, "doomed")
    assert h.pread(512, 0) == b"\x00" * 512
    # The test deletes the export when it reads this line.
    print("connected", flush=True)
    sys.stdin.readline()
    expect_error(errno.ESHUTDOWN, h.pread, 512, 0)
    expect_error(errno.ESHUTDOWN, h.flush)
    h.shutdown()


def check_multi_conn(socket):
    handles = [connect(socket, "vol") for _ in range(3)]
    assert all(h.can_multi_conn() for h in handles)
    writer, flusher, reader = handles
    writer.pwrite(b"\x5a" * MIB, 2 * MIB)
    flusher.flush()
    assert reader.pread(MIB, 2 * MIB) == b"\x5a" * MIB
    for h in handles:
        h.shutdown()


def wait_all(h):
    while h.aio_in_flight() > 0:
        h.poll(-1)


def check_pipelined(socket):
    h = connect(socket, "vol")
    # Many requests in flight at once, of mixed kinds and sizes.
    for i in range(64):
        h.aio_pwrite(bytes([i]) * (4096 * (1 + i % 8)), i * 64 * 1024)
    assert h.aio_in_flight() > 1
    wait_all(h)
    buffers = [nbd.Buffer(4096 * (1 + i % 8)) for i in range(64)]
    for i in range(64):
        h.aio_pread(buffers[i], i * 64 * 1024)
    wait_all(h)
    for i, buf in enumerate(buffers):
        assert buf.to_bytearray() == bytes([i]) * (4096 * (1 + i % 8)), i
    h.shutdown()


def check_out_of_order(socket):
    # The export holds a read of offset 0 until something is written. A read
    # of offset 4096 sent after it must be answered first, and the held read
    # must complete once a later write opens the gate (a server running
    # requests one at a time would fail it once the export gives up waiting).
    h = connect(socket, "gate")
    held = h.aio_pread(nbd.Buffer(512), 0)
    quick = h.aio_pread(nbd.Buffer(512), 4096)
    while not h.aio_command_completed(quick):
        h.poll(-1)
    assert not h.aio_command_completed(held), "held read answered before the gate opened"
    h.aio_pwrite(b"\x01" * 512, 8192)
    wait_all(h)
    assert h.aio_command_completed(held)
    h.shutdown()


def check_negotiation(socket):
    h = nbd.NBD()
    h.set_opt_mode(True)
    h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.connect_unix(socket)
    names = []
    h.opt_list(lambda name, description: names.append(name) or 0)
    assert sorted(names) == ["gate", "vol"], names
    contexts = []
    h.set_export_name("vol")
    h.opt_list_meta_context(lambda context: contexts.append(context) or 0)
    assert contexts == [nbd.CONTEXT_BASE_ALLOCATION], contexts
    h.set_export_name("missing")
    try:
        h.opt_info()
        raise AssertionError("opt_info of a missing export succeeded")
    except nbd.Error:
        pass
    h.set_export_name("vol")
    h.opt_info()
    assert h.get_size() == 64 * MIB
    assert h.get_block_size(nbd.SIZE_MINIMUM) == 512
    h.opt_go()
    assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.shutdown()


def check_many_clients(socket):
    # Four connections to each of four exports, all with requests in flight
    # at once; every connection then verifies what the others wrote.
    exports = ["vol", "vol2", "vol3", "vol4"]
    handles = [(name, slot, connect(socket, name)) for name in exports for slot in range(4)]
    for name, slot, h in handles:
        for block in range(16):
            pattern = bytes([exports.index(name) * 16 + slot]) * 65536
            h.aio_pwrite(pattern, (slot * 16 + block) * 65536)
    for _, _, h in handles:
        wait_all(h)
        h.flush()
    for name, _, h in handles:
        for slot in range(4):
            expected = bytes([exports.index(name) * 16 + slot]) * 65536
            for block in (0, 15):
                assert h.pread(65536, (slot * 16 + block) * 65536) == expected, (name, slot)
    for _, _, h in handles:
        h.shutdown()


if __name__ == "__main__":
    globals()["check_" + sys.argv[1]](sys.argv[2])
