#!/usr/bin/python3
"""Writes protocol_v9.json: test vectors for docs/protocol.md, version 9.

Written from docs/protocol.md alone (not from libxagg), so that the C++ test
that checks libxagg against the vectors (tests/unit/vectors_test.cpp) compares
two implementations of the text. Another implementation can check itself
against the same file. Run: python3 tests/vectors/make_vectors.py > tests/vectors/protocol_v9.json
"""

import hashlib
import hmac
import json
import math
import struct

VERSION = 9
DATA, RESULT = 1, 2
SUM, MAX, OR = 0, 1, 2
RESEND = 1
SCATTER, OWNER, NARROW = 4, 8, 16


def header(kind, job, token, iteration, chunk, rank, op, flags, total):
    """Section 3.1: 32 bytes, big-endian."""
    return struct.pack(">HBBIQIIHBBI", 0x5841, VERSION, kind, job, token, iteration, chunk, rank, op, flags, total)


def packet(fields, payload):
    """Header plus the payload's int32 elements (section 3.2), or with flag NARROW int16 lanes (section 11),
    little-endian."""
    lane = "h" if fields["flags"] & NARROW else "i"
    return header(**fields) + struct.pack(f"<{len(payload)}{lane}", *payload)


def wrap32(value):
    return (value + 2 ** 31) % 2 ** 32 - 2 ** 31


def scale_bits(world_size):
    """Section 5.2: S = 30 - ceil(log2 N)."""
    return 30 - (world_size - 1).bit_length()


def exponent(values):
    """Section 5.1: frexp exponent of max|x|; INT32_MIN if all zero, INT32_MAX if NaN or Inf."""
    if any(math.isnan(x) or math.isinf(x) for x in values):
        return 2 ** 31 - 1
    largest = max(abs(x) for x in values)
    return -2 ** 31 if largest == 0 else math.frexp(largest)[1]


def quantize(values, e, world_size):
    """Section 5.2: round(x * 2^(S - e)), ties to even (Python's round)."""
    return [round(x * 2.0 ** (scale_bits(world_size) - e)) for x in values]


INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1


def float32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def packets():
    token = 0x0123456789ABCDEF
    shares = [[1, -2, 2 ** 31 - 1], [5, 7, 1]]
    total = len(shares[0])
    vectors = []
    for rank, share in enumerate(shares):
        fields = dict(kind=DATA, job=7, token=token, iteration=3, chunk=0, rank=rank, op=SUM, flags=0, total=total)
        vectors.append({"name": f"SUM DATA of rank {rank}", "fields": fields, "payload": share,
                        "hex": packet(fields, share).hex()})
    result = [wrap32(a + b) for a, b in zip(*shares)]  # wraps modulo 2^32
    fields = dict(kind=RESULT, job=7, token=token, iteration=3, chunk=0, rank=1, op=SUM, flags=0, total=total)
    vectors.append({"name": "its RESULT, broadcast", "fields": fields, "payload": result,
                    "hex": packet(fields, result).hex()})
    fields = dict(fields, rank=0, flags=RESEND)
    vectors.append({"name": "the RESULT resent to rank 0", "fields": fields, "payload": result,
                    "hex": packet(fields, result).hex()})
    fields = dict(kind=DATA, job=0xFFFFFFFF, token=2 ** 64 - 1, iteration=2 ** 32 - 1, chunk=12345, rank=63, op=MAX,
                  flags=0, total=4096 + 2048 + 1)
    vectors.append({"name": "MAX DATA at the fields' limits", "fields": fields, "payload": [-(2 ** 31)],
                    "hex": packet(fields, [-(2 ** 31)]).hex()})
    # Section 10: a reduce-scatter chunk owned by rank 1, and the RESULTs its owner and rank 0 get.
    for rank, share in enumerate(shares):
        fields = dict(kind=DATA, job=7, token=token, iteration=4, chunk=1, rank=rank, op=SUM,
                      flags=SCATTER | (OWNER if rank == 1 else 0), total=total)
        vectors.append({"name": f"reduce-scatter DATA of rank {rank}", "fields": fields, "payload": share,
                        "hex": packet(fields, share).hex()})
    fields = dict(kind=RESULT, job=7, token=token, iteration=4, chunk=1, rank=1, op=SUM, flags=SCATTER, total=total)
    vectors.append({"name": "its RESULT to the owner, rank 1", "fields": fields, "payload": result,
                    "hex": packet(fields, result).hex()})
    vectors.append({"name": "its RESULT to rank 0: the header alone", "fields": fields, "payload": [],
                    "hex": packet(fields, []).hex()})
    # Section 5.4 b: the finite-exponent use of a chunk holding NaN carries the all-reduce's total, not 1.
    fields = dict(kind=DATA, job=7, token=token, iteration=5, chunk=2, rank=0, op=MAX, flags=0, total=3)
    vectors.append({"name": "finite-exponent use (5.4 b) of a 3-element NaN chunk", "fields": fields,
                    "payload": [1], "hex": packet(fields, [1]).hex()})
    return vectors


def data_port_verdicts():
    """Section 3.4: what an aggregator counts for packets that reach its data port."""
    header_only = dict(kind=RESULT, job=7, token=0x0123456789ABCDEF, iteration=4, chunk=1, rank=1, op=SUM,
                       flags=SCATTER, total=3)
    return [{"name": "a header-only SCATTER RESULT (section 10.3) sent to a data port",
             "hex": packet(header_only, []).hex(), "counter": "malformed"}]


def quantization():
    cases = [
        ("4 ranks, mixed magnitudes", 4, [1.5, -0.25, 3.0, 1e-9, 0.0, -2.9999998]),
        ("3 ranks, a tie to even", 3, [0.5, 2.0 ** -29, 3 * 2.0 ** -29, -(2.0 ** -29)]),
        # e = 1, S = 28: x * 2^27 = 0.5, 1.5, 2.5, 3.5 and their negatives, and -0.0.
        ("ties to even, both signs", 4, [1.0] + [k * 2.0 ** -28 for k in (1, 3, 5, 7, -1, -3, -5, -7)] + [-0.0]),
        ("1 rank, large values", 1, [3.0e38, -1.0e38, 1.0]),
        ("64 ranks, denormals", 64, [1e-45, 3e-45, -1e-40]),
        ("all zero", 2, [0.0, -0.0]),
        ("NaN and Inf", 2, [1.0, float("inf"), float("nan")]),
    ]
    vectors = []
    for name, world_size, values in cases:
        values = [float32(x) for x in values]
        e = exponent(values)
        vector = {"name": name, "world_size": world_size,
                  "values": [struct.pack("<f", x).hex() for x in values],  # float32 bits, little-endian
                  "exponent": e}
        if e == INT32_MAX:
            vector.update(non_finite_uses(values, world_size))
        else:  # INT32_MIN: an all-zero chunk is sent with zeros (section 5.2, sentinels)
            vector["quantized"] = [0] * len(values) if e == INT32_MIN else quantize(values, e, world_size)
        vectors.append(vector)
    return vectors


def non_finite_uses(values, world_size):
    """Section 5.4: a chunk whose exponent is INT32_MAX goes as three uses, not as quantized values."""
    finite = [x for x in values if math.isfinite(x)]
    f = exponent(finite) if any(finite) else INT32_MIN
    kinds = [1 if math.isnan(x) else 2 ** 7 if x == math.inf else 2 ** 14 if x == -math.inf else 0 for x in values]
    return {"kinds": kinds, "finite_exponent": f,
            "finite_quantized": [0 if not math.isfinite(x) or f == INT32_MIN else
                                 round(x * 2.0 ** (scale_bits(world_size) - f)) for x in values]}


def prediction():
    """Section 5.3: the remembered exponent m, the common exponent e, and what every rank decides."""
    vectors = []
    for m, e in [(INT32_MIN, 3), (INT32_MAX, 3), (3, 5), (3, 1), (3, 0), (3, 6), (3, INT32_MIN), (3, INT32_MAX),
                 (-140, -142), (-140, -147)]:
        p = None if m in (INT32_MIN, INT32_MAX) else m + 2
        holds = p is not None and ((p <= e + 4 and e <= p) or e == INT32_MIN)
        vectors.append({"remembered": m, "predicted": p, "common": e, "holds": holds,
                        "values_use": p if holds else e, "redo": p is not None and not holds})
    return vectors


def chunk_elements(mtu, wire_bits=32):
    """Section 1: the int32 elements that fit after IPv4, UDP and the header, in whole 8s, at most 2048;
    section 11: twice that on the 16-bit wire."""
    wide = min(2048, (mtu - 20 - 8 - 32) // 4 // 8 * 8)
    return 2 * wide if wire_bits == 16 else wide


def rescale(total, shift):
    """Section 11: a 16-bit SUM's result lane, total / 2^shift rounded to nearest, ties to even (exact in
    Python's integers: divmod floors)."""
    if shift == 0:
        return total
    quotient, rest = divmod(total, 2 ** shift)
    half = 2 ** (shift - 1)
    return quotient + (1 if rest > half or (rest == half and quotient % 2) else 0)


def wire16():
    """Section 11: the 16-bit wire. A join and start; DATA and RESULT with 16-bit lanes; the rescaling of
    sums; and float32 chunks of several ranks through the whole path (each rank's lanes, the aggregator's
    sum and its rescaled result, the dequantized float32)."""
    token = 0x0123456789ABCDEF
    c = chunk_elements(1500, 16)
    data_chunks = -(-1000 // c)
    join = {"type": "join", "version": VERSION, "job": 9, "rank": 0, "world_size": 3, "elements": 1000,
            "mtu": 1500, "wire_bits": 16}
    start = {"type": "start", "mtu": 1500, "chunk_elements": c, "chunks": data_chunks + -(-data_chunks // c),
             "results": "broadcast", "wire_bits": 16}
    shares = [[32767, -32768, 3, -3, 1], [32767, -32768, 0, 0, 0], [32767, -32768, 0, 0, 1]]
    shift = (len(shares) - 1).bit_length()
    packets = []
    for rank, share in enumerate(shares):
        fields = dict(kind=DATA, job=9, token=token, iteration=1, chunk=2, rank=rank, op=SUM, flags=NARROW,
                      total=len(share))
        packets.append({"name": f"16-bit SUM DATA of rank {rank}", "fields": fields, "payload": share,
                        "hex": packet(fields, share).hex()})
    result = [rescale(sum(lanes), shift) for lanes in zip(*shares)]
    fields = dict(kind=RESULT, job=9, token=token, iteration=1, chunk=2, rank=2, op=SUM, flags=NARROW,
                  total=len(shares[0]))
    packets.append({"name": f"its RESULT: sums / 2^{shift}, ties to even", "fields": fields, "payload": result,
                    "hex": packet(fields, result).hex()})
    fields = dict(kind=DATA, job=9, token=token, iteration=7, chunk=0, rank=1, op=OR, flags=NARROW, total=3)
    packets.append({"name": "16-bit OR DATA (non-finite kinds)", "fields": fields, "payload": [1 | 8 | 16, 2 | 8, 4 | 16],
                    "hex": packet(fields, [1 | 8 | 16, 2 | 8, 4 | 16]).hex()})
    rescales = [{"sum": total, "shift": k, "result": rescale(total, k)}
                for total, k in [(2, 2), (6, 2), (10, 2), (-2, 2), (-6, 2), (-10, 2), (3, 1), (-3, 1), (1, 2),
                                 (-1, 2), (7, 0), (64 * 32767, 6), (64 * -32768, 6), (2 ** 25 + 2 ** 19, 12)]]
    cases = [
        ("3 ranks, mixed magnitudes", [[1.5, -0.25, 3.0, 1e-4, 0.0], [0.75, 0.125, -3.5, 2e-4, -0.0],
                                       [-1.0, 0.5, 1.0, 0.0, 0.0]]),
        ("4 ranks, lanes at 2^14", [[float32(1.0 - 2 ** -24), -float32(1.0 - 2 ** -24)]] * 4),
        ("2 ranks, ties to even", [[1.0, 2.0 ** -14, 3 * 2.0 ** -14, -(2.0 ** -14), 2.0 ** -15],
                                   [0.0, 0.0, 0.0, 0.0, 2.0 ** -15]]),
    ]
    chunks = []
    for name, ranks in cases:
        ranks = [[float32(x) for x in values] for values in ranks]
        e = max(exponent(values) for values in ranks)
        lanes = [[round(x * 2.0 ** (14 - e)) for x in values] for values in ranks]  # ties to even
        sums = [sum(column) for column in zip(*lanes)]
        k = (len(ranks) - 1).bit_length()
        results = [rescale(total, k) for total in sums]
        chunks.append({"name": name, "world_size": len(ranks),
                       "values": [[struct.pack("<f", x).hex() for x in values] for values in ranks],
                       "exponent": e, "lanes": lanes, "sums": sums, "sum_shift": k, "result_lanes": results,
                       "result": [struct.pack("<f", float32(r * 2.0 ** (e - 14 + k))).hex() for r in results]})
    return {"join": join, "start": start, "packets": packets, "rescale": rescales, "chunks": chunks}


def layout(elements, mtu):
    """Section 1: data chunks of chunk_elements(mtu) elements, then one exponent per data chunk."""
    c = chunk_elements(mtu)
    data = -(-elements // c)
    return {"elements": elements, "mtu": mtu, "chunk_elements": c, "data_chunks": data,
            "exponent_chunks": -(-data // c)}


def layouts():
    return [layout(elements, mtu) for mtu in (1280, 1500, 4000, 8251, 8252, 9000)
            for elements in (1, 2048, 2049, 25_000_000)]


def ceil_div(a, b):
    return -(-a // b)


def operation_chunks(count, dtype, c):
    """Sections 4 and 5: an all-reduce's (exponent chunks, data chunks); int32 has no exponent chunks."""
    data = ceil_div(count, c)
    return (ceil_div(data, c) if dtype == "float32" else 0), data


def placement():
    """Section 4 item 2: consecutive ranges in call order; a step mark puts the next one at 0, a range past
    `chunks` starts at 0, an all-reduce of 0 elements takes nothing."""
    chunks, c = 10, 2048
    sequence = [("step",), ("float32", 1), ("float32", 3000), ("int32", 5000), ("float32", 4096), ("step",),
                ("float32", 1), ("int32", 0), ("int32", 2048)]
    p, out = 0, []
    for item in sequence:
        if item[0] == "step":
            p = 0
            out.append({"step": True})
            continue
        k = sum(operation_chunks(item[1], item[0], c))
        first = 0 if p + k > chunks else p
        out.append({"dtype": item[0], "count": item[1], "range": [first, first + k]})
        p = first + k if k else p
    return {"chunks": chunks, "chunk_elements": c, "sequence": out}


def reduce_scatter():
    """Section 10 and section 4 item 6: `xagg worker --collective reduce-scatter` of E float32 elements on
    N ranks, one iteration: the step mark, the one-element all-reduce, then one all-reduce per shard in owner
    order, each with its chunks, total and every rank's DATA flags on its data chunks."""
    elements, world_size, c = 2000, 2, 2048
    count = elements // world_size
    sequence, p = [{"step": True}], 0
    # (name, owner, elements): the line-up all-reduce is plain (no owner), then the shards in owner order.
    for name, owner, n in [("one element, plain", None, 1)] + [(f"shard {r}", r, count) for r in range(world_size)]:
        exponents, data = operation_chunks(n, "float32", c)
        use = {"name": name, "count": n, "range": [p, p + exponents + data], "total": n,
               "exponent_chunks": list(range(p, p + exponents)),
               "data_chunks": list(range(p + exponents, p + exponents + data)),
               "data_flags": [0 if owner is None else SCATTER | (OWNER if rank == owner else 0)
                              for rank in range(world_size)]}
        if owner is not None:
            use.update(owner=owner, shard_elements=[owner * count, (owner + 1) * count])
        sequence.append(use)
        p += exponents + data
    return {"elements": elements, "world_size": world_size, "chunk_elements": c, "sequence": sequence}


def sharding():
    """Section 6.1-6.2: smooth weighted round robin over `chunks` job chunks, each aggregator's local indexes."""
    weights, chunks = [3, 1, 2], 20
    places = sum(weights)
    credit, pattern = [0] * len(weights), []
    for _ in range(places):
        credit = [cr + w for cr, w in zip(credit, weights)]
        k = max(range(len(weights)), key=lambda i: (credit[i], -i))
        credit[k] -= places
        pattern.append(k)
    owners, local = [], []
    for chunk in range(chunks):
        k = pattern[chunk % places]
        owners.append(k)
        local.append((chunk // places) * weights[k] + pattern[:chunk % places].count(k))
    held = [(chunks // places) * w + pattern[:chunks % places].count(k) for k, w in enumerate(weights)]
    return {"weights": weights, "chunks": chunks, "pattern": pattern, "owner": owners, "local_index": local,
            "chunks_held": held}


def join_mtu():
    """Sections 1 and 2: the `mtu` a rank joins with for the IP_MTU it reads (at most 65535), and its chunk
    size; below 1280 a rank cannot join."""
    return [{"ip_mtu": m, "join_mtu": min(m, 65535) if m >= 1280 else None,
             "chunk_elements": chunk_elements(min(m, 65535)) if m >= 1280 else None}
            for m in (65536, 65535, 9000, 1500, 1280, 1279)]


def join():
    """Two ranks join with different MTUs: the job takes the smaller one (section 2)."""
    requests = [{"type": "join", "version": VERSION, "job": 7, "rank": rank, "world_size": 2, "elements": 1000,
                 "mtu": mtu} for rank, mtu in enumerate((9000, 1500))]
    agreed = layout(1000, 1500)
    return {
        "requests": requests,
        "reply": {"type": "joined", "token": "0123456789abcdef", "data_port": 9987, "result_port": 20000,
                  "broadcast": "198.18.255.255"},
        "start": {"type": "start", "mtu": 1500, "chunk_elements": agreed["chunk_elements"],
                  "chunks": agreed["data_chunks"] + agreed["exponent_chunks"], "results": "broadcast",
                  "wire_bits": 32},
        # Section 2: the same start where the job's results go to a multicast group, and by unicast.
        "start_multicast": {"type": "start", "mtu": 1500, "chunk_elements": agreed["chunk_elements"],
                            "chunks": agreed["data_chunks"] + agreed["exponent_chunks"], "results": "multicast",
                            "wire_bits": 32, "group": "239.18.0.5"},
        "start_unicast": {"type": "start", "mtu": 1500, "chunk_elements": agreed["chunk_elements"],
                          "chunks": agreed["data_chunks"] + agreed["exponent_chunks"], "results": "unicast",
                          "wire_bits": 32},
    }


def admission():
    """A join to an aggregator with a cluster secret (protocol.md 2.1)."""
    secret = "correct horse battery staple"
    nonce = "00112233445566778899aabbccddeeff"
    job, rank, world_size = 7, 1, 2
    message = f"xagg-join {nonce} {job} {rank} {world_size}"
    auth = hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()
    return {"secret": secret,
            "challenge": {"type": "challenge", "nonce": nonce},
            "request": {"type": "join", "version": VERSION, "job": job, "rank": rank, "world_size": world_size,
                        "elements": 3, "mtu": 9000, "auth": auth}}


def main():
    print(json.dumps({
        "version": VERSION,
        "about": "docs/protocol.md test vectors, written by tests/vectors/make_vectors.py",
        "join": join(),
        "layouts": layouts(),
        "admission": admission(),
        "packets": packets(),
        "quantization": quantization(),
        "prediction": prediction(),
        "placement": placement(),
        "reduce_scatter": reduce_scatter(),
        "sharding": sharding(),
        "join_mtu": join_mtu(),
        "data_port_verdicts": data_port_verdicts(),
        "wire16": wire16(),
    }, indent=1))


if __name__ == "__main__":
    main()
