"""st_io.py - a minimal safetensors writer/reader (numpy), and the config JSON in the
exact text form linmoe's lm_config_to_json (cJSON_PrintUnformatted) produces."""
import json
import math
import struct
import zlib

import numpy as np

_DT = {np.dtype("float64"): "F64", np.dtype("float32"): "F32", np.dtype("int32"): "I32"}
_NP = {v: k for k, v in _DT.items()}


def write(path, tensors, metadata):
    """tensors: list of (name, numpy array); metadata: {str: str}. Adds linmoe_crc32
    (CRC-32 of the data section, "%08x"), which linmoe's reader verifies."""
    header, blobs, off = {}, [], 0
    for name, a in tensors:
        a = np.ascontiguousarray(a)
        if a.dtype not in _DT:
            raise TypeError(f"{name}: dtype {a.dtype}")
        b = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _DT[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    data = b"".join(blobs)
    meta = dict(metadata)
    meta["linmoe_crc32"] = "%08x" % (zlib.crc32(data) & 0xFFFFFFFF)
    header = {"__metadata__": meta, **header}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        f.write(data)


def read(path):
    """Returns ({name: numpy array}, metadata)."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        b, t = e["data_offsets"]
        out[name] = np.frombuffer(data[b:t], dtype=_NP[e["dtype"]].newbyteorder("<")).reshape(e["shape"]).copy()
    return out, meta


def _cjson_number(d):
    # cJSON print_number: integers as %d, otherwise %1.15g unless that does not read
    # back to the same double, then %1.17g
    if math.isnan(d) or math.isinf(d):
        return "null"
    if d == int(d) and abs(d) < 2**31:
        return "%d" % int(d)
    s = "%1.15g" % d
    if float(s) != d:
        s = "%1.17g" % d
    return s


# lm_config fields in the order of FIELDS[] in src/model/config.c
CONFIG_KEYS = [
    "name", "vocab", "d_model", "n_layers", "norm_eps", "init_std", "tie_embeddings", "seq_len",
    "mla_period", "mla_last", "layer_types", "first_dense",
    "kda_heads", "kda_head_dim", "kda_conv", "gate_mode", "gate_lb", "kda_chunk", "kda_form", "kda_full_rank_gate",
    "mla_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_dim", "qk_extra_dim", "v_head_dim", "mla_gated",
    "d_ff_dense", "n_experts", "top_k", "n_shared", "d_ff_expert", "moe_latent_dim", "route_scale", "expert_act",
    "balance", "qb_bins", "balance_rate", "aux_coef", "zloss_coef", "capacity_factor", "capacity_relax_steps",
    "residual", "block_layers",
]


def config_json(cfg):
    """The config dict as lm_config_to_json writes it (same key order, cJSON number text)."""
    parts = []
    for k in CONFIG_KEYS:
        v = cfg[k]
        if isinstance(v, str):
            s = json.dumps(v)
        else:
            s = _cjson_number(float(v))
        parts.append(json.dumps(k) + ":" + s)
    return "{" + ",".join(parts) + "}"
