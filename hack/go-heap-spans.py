# Which pages of a live Go process's heap are resident, and why (decision 1700).
#
#   gdb -p PID -batch -x hack/go-heap-spans.py
#
# Walks the runtime's span list (runtime.mheap_.allspans) and reads
# /proc/PID/pagemap: prints the resident KiB of each stack (by owner: a
# thread's g0 or signal stack, or a goroutine), the resident KiB per span
# class (size class, scan or noscan), and the type of each pointerful object
# larger than 512 bytes (Go keeps a type header in those). Needs root and
# the binary's DWARF (make build keeps it); written against Go 1.26's
# runtime field names. A debugging aid: it stops the process while it runs.
import collections
import struct

import gdb

inf = gdb.selected_inferior()
pagemap = open("/proc/%d/pagemap" % inf.pid, "rb")


def resident_kib(lo, hi):
    n = 0
    for a in range(lo & ~4095, hi, 4096):
        pagemap.seek((a // 4096) * 8)
        if struct.unpack("<Q", pagemap.read(8))[0] >> 63:
            n += 4
    return n


def word(addr, size=8, signed=False):
    return int.from_bytes(bytes(inf.read_memory(addr, size)), "little", signed=signed)


def type_name(t):
    # abi.Type.Str is a nameOff (int32) at offset 40, relative to the
    # module's types; a name is a flag byte, a length byte (names here are
    # short), then the bytes.
    base = int(gdb.parse_and_eval("'runtime.firstmoduledata'")["types"])
    name = base + word(t + 40, 4, signed=True)
    b = bytes(inf.read_memory(name, 2 + 255))
    return b[2:2 + b[1]].decode(errors="replace")


stacks = []
m = gdb.parse_and_eval("'runtime.allm'")
while int(m) != 0:
    md = m.dereference()
    for field in ("g0", "gsignal"):
        if int(md[field]) != 0:
            st = md[field].dereference()["stack"]
            stacks.append((int(st["lo"]), int(st["hi"]), "thread m%d %s" % (int(md["id"]), field)))
    m = md["alllink"]
allgs = gdb.parse_and_eval("'runtime.allgs'")
for i in range(int(allgs["len"])):
    g = allgs["array"][i].dereference()
    st = g["stack"]
    if int(st["lo"]):
        stacks.append((int(st["lo"]), int(st["hi"]), "goroutine %d (status %d)" % (int(g["goid"]), int(g["atomicstatus"]["value"]))))

spans = gdb.parse_and_eval("'runtime.mheap_'")["allspans"]
by_class, count, objects = collections.Counter(), collections.Counter(), []
for i in range(int(spans["len"])):
    s = spans["array"][i].dereference()
    lo, state, sc = int(s["startAddr"]), int(s["state"]["s"]["value"]), int(s["spanclass"])
    hi = lo + int(s["npages"]) * 8192
    if state == 1:  # mSpanInUse: heap objects
        es = int(s["elemsize"])
        key = "size class %2d %-6s (%d B objects)" % (sc >> 1, "noscan" if sc & 1 else "scan", es)
        if not sc & 1 and es > 512:
            for k in range(int(s["nelems"])):
                t = word(lo + k * es)
                if t:
                    objects.append((es, type_name(t)))
    elif state == 2:  # mSpanManual: stacks
        key = "stacks"
    else:
        continue
    by_class[key] += resident_kib(lo, hi)
    count[key] += 1

print("stacks (KiB size, KiB resident):")
for lo, hi, name in sorted(stacks, key=lambda x: x[2]):
    print("  %-32s %4d %4d" % (name, (hi - lo) // 1024, resident_kib(lo, hi)))
print("resident KiB by span class (spans):")
for k, v in sorted(by_class.items(), key=lambda kv: -kv[1]):
    print("  %5d  %s (%d)" % (v, k, count[k]))
print("  %5d  total" % sum(by_class.values()))
print("pointerful objects over 512 B (size, type):")
for es, name in objects:
    print("  %6d  %s" % (es, name))
