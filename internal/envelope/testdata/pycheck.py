"""Differential oracle for envelope tests: reliomq's JSON rules in Python.

Usage: python3 pycheck.py SEED COUNT
Prints one JSON line per generated input: {"in": hex, "out": hex or null}.
"out" is what reliomq's canonical encoder prints for the decoded value, or
null when reliomq's decoder rejects the input. Mirrors reliomq.protocol:
strict UTF-8, json.loads with duplicate keys and NaN/Infinity rejected,
every float finite, every string encodable as UTF-8, then json.dumps with
sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False.
"""
import json, math, random, struct, sys


def no_dups(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError("duplicate key")
        d[k] = v
    return d


def reject_constant(name):
    raise ValueError("constant " + name)


def check(v):
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError("non-finite")
    if isinstance(v, str):
        v.encode("utf-8")
    if isinstance(v, list):
        for x in v:
            check(x)
    if isinstance(v, dict):
        for k, x in v.items():
            k.encode("utf-8")
            check(x)


def oracle(data):
    try:
        v = json.loads(data.decode("utf-8"), object_pairs_hook=no_dups, parse_constant=reject_constant)
        check(v)
        return json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (ValueError, UnicodeError, RecursionError):
        return None


rnd = random.Random(int(sys.argv[1]))

ATOMS = ['"\\ud800"', '"\\udc00"', '"\\ud83d\\ude00"', '"\\ud83d"', 'NaN', 'Infinity', '-Infinity',
         '1e400', '-1e400', '1e-400', '-0', '-0.0', '0.0', '1E2', '1e+2', '00', '01', '1.', '.5', '-',
         '"\\u00e9"', '"\\u001F"', '"\\/"', '"\x7f"', '"\u2028<>&"', '"\\x"', 'tru', 'nul', '"\t"',
         '123456789012345678901234567890', '1' * 4300, '1' * 4301, '"é"', '\ufeff1']


def rand_float():
    kind = rnd.random()
    if kind < 0.4:
        return repr(struct.unpack("<d", struct.pack("<Q", rnd.getrandbits(64)))[0])
    if kind < 0.7:
        return "%de%d" % (rnd.randint(-99999, 99999), rnd.randint(-330, 330))
    return "%d.%0*d" % (rnd.randint(-10**6, 10**6), rnd.randint(1, 8), rnd.randint(0, 10**8 - 1))


def rand_string():
    chars = []
    for _ in range(rnd.randint(0, 6)):
        r = rnd.random()
        if r < 0.3:
            chars.append(chr(rnd.randint(0, 0x7f)))
        elif r < 0.5:
            chars.append(chr(rnd.choice([0x2028, 0x2029, 0xe9, 0x4e2d, 0x1f600, 0xfeff, 0x10ffff])))
        else:
            chars.append(rnd.choice("abcAB_-z"))
    s = "".join(chars)
    if rnd.random() < 0.5:
        return json.dumps(s, ensure_ascii=rnd.random() < 0.5)
    # raw, possibly with unescaped control characters (invalid JSON)
    return '"' + s.replace("\\", "").replace('"', "") + '"'


def rand_value(depth):
    r = rnd.random()
    if depth > 4 or r < 0.35:
        c = rnd.random()
        if c < 0.3:
            return rand_float()
        if c < 0.45:
            return str(rnd.randint(-10**20, 10**20))
        if c < 0.75:
            return rand_string()
        if c < 0.85:
            return rnd.choice(["true", "false", "null"])
        return rnd.choice(ATOMS)
    ws = lambda: rnd.choice(["", "", " ", "\n", "\t", "\r\n "])
    n = rnd.randint(0, 4)
    if r < 0.65:
        return "[" + ws() + ("," + ws()).join(rand_value(depth + 1) for _ in range(n)) + ws() + "]"
    keys = [rnd.choice(['"a"', '"b"', '"\\u0061"', '"é"', '"\\u00e9"', '"Z"', '""', '"\\ud800"', '"\u2028"', '"a\\u0000"'])
            if rnd.random() < 0.5 else rand_string() for _ in range(n)]
    return "{" + ws() + ",".join(k + ws() + ":" + ws() + rand_value(depth + 1) for k in keys) + ws() + "}"


for _ in range(int(sys.argv[2])):
    text = rand_value(0)
    if rnd.random() < 0.1:
        text = " " + text + rnd.choice(["", " ", "x", ",", "\x00"])
    data = text.encode("utf-8", "surrogatepass")
    if rnd.random() < 0.03 and data:
        i = rnd.randrange(len(data))
        data = data[:i] + bytes([rnd.choice([0x80, 0xff, 0xc3, 0xed])]) + data[i + 1:]
    out = oracle(data)
    print(json.dumps({"in": data.hex(), "out": None if out is None else out.hex()}))
