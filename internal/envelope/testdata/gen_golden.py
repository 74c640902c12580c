"""Writes golden.json: reliomq v1 wire vectors computed by Python's json.

Run from this directory: python3 gen_golden.py > golden.json
The encoding is reliomq.protocol's _canonical_bytes: json.dumps with
sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
encoded as UTF-8.

Each vector has a "message" (ingress, delivery or ack), the fields a
sender passes in ("event_id", "topic", "payload" as raw, possibly
non-canonical JSON text), the canonical payload, and "wire", the exact bytes
reliomq sends. Vectors with "wire_in" are decode-only: reliomq accepts that
non-canonical text and re-emits it as "wire".
"""
import json


def dumps(v):
    return json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def strict_loads(text):
    def no_dups(pairs):
        d = {}
        for k, v in pairs:
            assert k not in d, k
            d[k] = v
        return d

    def no_const(name):
        raise ValueError(name)

    return json.loads(text, object_pairs_hook=no_dups, parse_constant=no_const)


README_ID = "47913ac65ac84213a9361b393b845708"
LONG_ID = ("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-" * 2)[:128]

PAYLOADS = {
    "readme": '{"temperature": 25.2}',
    "unsorted_nested": '{"z":1,"a":{"y":[3,2,1],"b":null,"a":true},"m":false,"B":{},"aa":[]}',
    "unicode": '{"name":"Grüße 中文 😀","seps":"\u2028\u2029","html":"<a href=\\"x\\">&amp;</a>","é":"\\u00e9\\ud83d\\ude00","\\u4e2d":1}',
    "floats": "[25.2,1e16,1e-5,1.0,-0.0,1.5e300,0.0001,0.00001,100.0,9999999999999998.0,1E2,2.5e-07,5e-324,"
              "1.7976931348623157e308,0.1,123456789.123456789,1e-400,-1e-400,0.1e1,4.35,1e15,1e+22,-2.5E-3,7e0]",
    "big_ints": "[12345678901234567890123,-0,-12345678901234567890,0,1,-1,9007199254740993]",
    "escapes": '["quote\\" backslash\\\\ slash\\/ nl\\n cr\\r tab\\t bs\\b ff\\f nul\\u0000 us\\u001F del\\u007f"]',
    "control_key": '{"\\u0001\\n":"\\u001b[0m","\\t":0}',
    "string": '"just a string"',
    "number": "42",
    "null": "null",
    "true": "true",
    "empty_array": "[]",
    "empty_object": "{}",
    "whitespace": ' \t{\n  "b" : 1 ,\t"a":[ 1 , { } ]\r\n}  ',
}

vectors = []
for name, text in PAYLOADS.items():
    value = strict_loads(text)
    canon = dumps(value)
    vectors.append({
        "name": "ingress_" + name, "message": "ingress", "event_id": README_ID,
        "topic": "factory/machine1/data", "payload": text, "payload_canonical": canon,
        "wire": dumps({"version": 1, "event_id": README_ID, "topic": "factory/machine1/data", "payload": value}),
    })
    vectors.append({
        "name": "delivery_" + name, "message": "delivery", "event_id": README_ID,
        "payload": text, "payload_canonical": canon,
        "wire": dumps({"version": 1, "event_id": README_ID, "payload": value}),
    })

for name, topic in {"unicode_topic": "fábrica/máquina-1/温度", "odd_topic": "$SYS/a b//\u2028\"\\",
                    "control_topic": "a\u0001b\tc"}.items():
    vectors.append({
        "name": "ingress_" + name, "message": "ingress", "event_id": "x", "topic": topic,
        "payload": "1", "payload_canonical": "1",
        "wire": dumps({"version": 1, "event_id": "x", "topic": topic, "payload": 1}),
    })
vectors.append({
    "name": "ingress_longest_event_id", "message": "ingress", "event_id": LONG_ID, "topic": "t",
    "payload": "{}", "payload_canonical": "{}",
    "wire": dumps({"version": 1, "event_id": LONG_ID, "topic": "t", "payload": {}}),
})

for name, eid in {"readme": README_ID, "short": "A-b_9", "longest": LONG_ID}.items():
    vectors.append({"name": "ack_" + name, "message": "ack", "event_id": eid,
                    "wire": dumps({"version": 1, "event_id": eid})})

# Decode-only: non-canonical text reliomq accepts.
ACCEPTED = {
    "ingress_readme_pretty": ("ingress", json.dumps({"version": 1, "event_id": README_ID,
                              "topic": "factory/machine1/data", "payload": {"temperature": 25.2}}, indent=2)),
    "ingress_escaped_keys": ("ingress", '{"\\u0065vent_id":"e1","p\\u0061yload":[1E2,-0],"top\\u0069c":"a\\/b","versio\\u006e":1}'),
    "delivery_spaced": ("delivery", ' \r\n\t{ "payload" : { "b" : 2 , "a" : 1 } , "version" : 1 , "event_id" : "id-1" } \n'),
    "ack_reordered": ("ack", '{"version":1,"event_id":"abc"}'),
}
for name, (message, text) in ACCEPTED.items():
    v = strict_loads(text)
    vectors.append({"name": name, "message": message, "wire_in": text, "wire": dumps(v),
                    "event_id": v["event_id"], "topic": v.get("topic"),
                    "payload_canonical": dumps(v["payload"]) if "payload" in v else None})

print(json.dumps(vectors, ensure_ascii=False, indent=1))
