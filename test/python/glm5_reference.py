"""Float64 numpy reference of one GLM-5 (llama.cpp `glm-dsa`) decode step.

Independent of Kiln's C++ code: the GGUF file is read only through
`gguf.GGUFReader` and dequantised only through `gguf.quants.dequantize`; the
arithmetic follows GLM5.md (the project's model notes) sections 2 and 6 (absorbed MLA, DSA
indexer, sigmoid-gated MoE with a shared expert) in float64. The only rounding
besides float64 is the cache: the latent cache ([c_kv | k_pe] per token) and
the indexer key cache are stored in `cache_dtype` (float16 by default, as
llama.cpp) between steps and read back as float64.

Meant for the tiny and small synthetic presets (weights are held dequantised).

    ref = GLM5Reference("model.gguf")
    logits, info = ref.run([1, 2, 3])      # teacher forcing from an empty cache
    info["min_gap"][i]                      # smallest decision gap at position i
    tokens = ref.generate([1, 2, 3], 8)     # greedy continuation

CLI: python glm5_reference.py MODEL.gguf --tokens 1,2,3 [--cache-dtype f16|f64]
     [--logits-out out.npy] [--generate N] [--dense]
"""
import argparse
import math
import pathlib
import re
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

ARCH = "glm-dsa"
INDEXER_KEY_NORM_EPS = 1e-6      # GLM5.md section 6 (HF value)
ROUTER_SUM_FLOOR = 6.1035e-5     # GLM5.md section 6
GATING_SOFTMAX, GATING_SIGMOID = 1, 2


# ---------------------------------------------------------------------------
# Small math helpers (float64 throughout)
# ---------------------------------------------------------------------------

def rms_norm(x, weight, eps):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def layer_norm(x, weight, bias, eps):
    mu = np.mean(x, axis=-1, keepdims=True)
    d = x - mu
    var = np.mean(d * d, axis=-1, keepdims=True)
    return d / np.sqrt(var + eps) * weight + bias


def rope_interleaved(x, position, theta):
    """Rotates pairs (2i, 2i+1) of the last axis by position * theta^(-2i/dims)."""
    dims = x.shape[-1]
    i = np.arange(dims // 2, dtype=np.float64)
    ang = float(position) * np.power(float(theta), -2.0 * i / dims)
    c, s = np.cos(ang), np.sin(ang)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def top_k_stable(scores, k):
    """Indices of the k largest scores (ties to the lower index), and the gap
    between the k-th and (k+1)-th largest (inf when nothing is dropped)."""
    n = scores.shape[0]
    if k >= n:
        return np.arange(n), math.inf
    order = np.argsort(-scores, kind="stable")
    gap = float(scores[order[k - 1]] - scores[order[k]])
    return order[:k], gap


def argmax_and_gap(logits):
    """argmax (ties to the lowest id) and top-1 minus top-2."""
    best = int(np.argmax(logits))  # numpy returns the first maximum
    if logits.shape[0] < 2:
        return best, math.inf
    rest = np.delete(logits, best)
    return best, float(logits[best] - np.max(rest))


# ---------------------------------------------------------------------------
# GGUF access (gguf-py only)
# ---------------------------------------------------------------------------

_SPLIT_RE = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")


def gguf_parts(path):
    """The files of a model: `path` itself, or every `-0000k-of-0000N` part
    when `path` is one part of a split (or the unsplit name of one)."""
    path = pathlib.Path(path)
    m = _SPLIT_RE.match(path.name)
    if m:
        stem, count = m.group(1), int(m.group(3))
    elif not path.exists():
        cands = sorted(path.parent.glob(path.stem + "-00001-of-*.gguf"))
        if not cands:
            raise FileNotFoundError(path)
        m = _SPLIT_RE.match(cands[0].name)
        stem, count = m.group(1), int(m.group(3))
    else:
        return [path]
    return [path.parent / f"{stem}-{k:05d}-of-{count:05d}.gguf"
            for k in range(1, count + 1)]


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    if len(f.types) > 1:
        return [f.contents(i) for i in range(len(f.data))]
    return f.contents()


def load_gguf(path, dtype=np.float64):
    """(metadata reader of the first part, {name: row-major array in dtype}).
    Arrays have the GGUF dims reversed (ne[0] innermost)."""
    parts = gguf_parts(path)
    readers = [GGUFReader(p) for p in parts]
    tensors = {}
    for r in readers:
        for t in r.tensors:
            if t.name in tensors:
                raise ValueError(f"{t.name} appears twice in {parts}")
            shape = tuple(reversed([int(d) for d in t.shape]))
            v = dequantize(t.data, t.tensor_type)
            tensors[t.name] = np.asarray(v).reshape(shape).astype(dtype)
    return readers[0], tensors


# ---------------------------------------------------------------------------
# Caches
# ---------------------------------------------------------------------------

class _Cache:
    """Per-token rows stored in `dtype`; position p holds row p."""

    def __init__(self, width, dtype, capacity=16):
        self.dtype = np.dtype(dtype)
        self.data = np.zeros((capacity, width), dtype=self.dtype)
        self.length = 0

    def put(self, position, row):
        if position > self.length:
            raise ValueError(f"cache holds positions 0..{self.length - 1}; "
                             f"cannot append position {position}")
        if position >= self.data.shape[0]:
            grown = np.zeros((2 * self.data.shape[0] + position,
                              self.data.shape[1]), dtype=self.dtype)
            grown[:self.length] = self.data[:self.length]
            self.data = grown
        self.data[position] = np.asarray(row, dtype=np.float64).astype(self.dtype)
        self.length = position + 1  # later rows are never read again

    def read(self):
        return self.data[:self.length].astype(np.float64)


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------

class GLM5Reference:
    """One GLM-5 decode step in float64.

    cache_dtype: dtype of the latent and indexer key caches between steps
        (np.float16 as llama.cpp, or np.float64).
    dense_attention: attend to every cached position (the indexer still runs
        and its scores are recorded, but selection is ignored).
    indexer_top_k: override of `attention.indexer.top_k` (None: from the file).
    weights_dtype: storage of the dequantised weights. float64 by default;
        float32 is lossless (gguf-py dequantises to float32) and halves memory;
        the arithmetic is float64 either way.
    """

    def __init__(self, path, cache_dtype=np.float16, dense_attention=False,
                 indexer_top_k=None, weights_dtype=np.float64):
        self.path = pathlib.Path(path)
        self.cache_dtype = np.dtype(cache_dtype)
        if self.cache_dtype not in (np.dtype(np.float16), np.dtype(np.float32),
                                    np.dtype(np.float64)):
            raise ValueError(f"unsupported cache dtype {self.cache_dtype}")
        self.dense_attention = bool(dense_attention)
        reader, tensors = load_gguf(path, weights_dtype)
        self._read_hparams(reader)
        if indexer_top_k is not None:
            self.hp["indexer_top_k"] = int(indexer_top_k)
        self._bind_weights(tensors)
        self.reset()

    # -- loading -------------------------------------------------------------

    def _read_hparams(self, reader):
        arch = _field(reader, "general.architecture")
        if arch != ARCH:
            raise ValueError(f"{self.path}: architecture {arch!r} is not {ARCH}")

        def key(name, default=None, required=True):
            v = _field(reader, f"{ARCH}.{name}")
            if v is None:
                if required and default is None:
                    raise ValueError(f"{self.path}: missing {ARCH}.{name}")
                return default
            return v

        hp = {}
        blocks = int(key("block_count"))
        hp["nextn"] = int(key("nextn_predict_layers", 0))
        hp["layers"] = blocks - hp["nextn"]
        hp["leading_dense"] = int(key("leading_dense_block_count", 0))
        hp["hidden"] = int(key("embedding_length"))
        hp["vocab"] = int(key("vocab_size", 0)) or None
        hp["heads"] = int(key("attention.head_count"))
        hp["q_lora"] = int(key("attention.q_lora_rank"))
        hp["kv_lora"] = int(key("attention.kv_lora_rank"))
        hp["rope_dims"] = int(key("rope.dimension_count"))
        hp["qk_head"] = int(key("attention.key_length_mla"))
        hp["qk_nope"] = hp["qk_head"] - hp["rope_dims"]
        hp["v_head"] = int(key("attention.value_length_mla"))
        hp["indexer_heads"] = int(key("attention.indexer.head_count"))
        hp["indexer_dim"] = int(key("attention.indexer.key_length"))
        hp["indexer_top_k"] = int(key("attention.indexer.top_k"))
        hp["rms_eps"] = float(key("attention.layer_norm_rms_epsilon"))
        hp["rope_theta"] = float(key("rope.freq_base"))
        hp["experts"] = int(key("expert_count", 0))
        hp["experts_used"] = int(key("expert_used_count", 0))
        hp["shared_experts"] = int(key("expert_shared_count", 0))
        hp["routed_scale"] = float(key("expert_weights_scale", 1.0))
        hp["weights_norm"] = bool(key("expert_weights_norm", False))
        hp["gating"] = int(key("expert_gating_func", GATING_SIGMOID))
        if hp["gating"] not in (GATING_SOFTMAX, GATING_SIGMOID):
            raise ValueError(f"{self.path}: expert_gating_func {hp['gating']} "
                             "is neither 1 (softmax) nor 2 (sigmoid)")
        if hp["layers"] <= 0 or hp["qk_nope"] <= 0:
            raise ValueError(f"{self.path}: inconsistent dims {hp}")
        # Cross-checks of the redundant keys (GLM5.md section 3).
        kl, vl = key("attention.key_length", required=False), \
            key("attention.value_length", required=False)
        if kl is not None and int(kl) != hp["kv_lora"] + hp["rope_dims"]:
            raise ValueError(f"{self.path}: key_length {kl} != kv_lora_rank "
                             f"+ rope dims")
        if vl is not None and int(vl) != hp["kv_lora"]:
            raise ValueError(f"{self.path}: value_length {vl} != kv_lora_rank")
        self.hp = hp

    def _bind_weights(self, t):
        hp = self.hp
        H, N = hp["hidden"], hp["heads"]
        nope, R, kvl = hp["qk_nope"], hp["rope_dims"], hp["kv_lora"]

        def need(name, shape=None):
            if name not in t:
                raise KeyError(f"{self.path}: missing tensor {name}")
            a = t[name]
            if shape is not None and tuple(a.shape) != tuple(shape):
                raise ValueError(f"{self.path}: {name} has shape {a.shape}, "
                                 f"expected {tuple(shape)}")
            return a

        self.token_embd = need("token_embd.weight")
        if hp["vocab"] is None:
            hp["vocab"] = self.token_embd.shape[0]
        V = hp["vocab"]
        need("token_embd.weight", (V, H))
        self.output_norm = need("output_norm.weight", (H,))
        self.output = t.get("output.weight", self.token_embd)  # tied if absent
        if "output.weight" in t:
            need("output.weight", (V, H))

        self.fused_gate_up = False
        self.layers = []
        for li in range(hp["layers"]):
            p = f"blk.{li}."
            L = {}
            for name, shape in [
                    ("attn_norm.weight", (H,)),
                    ("attn_q_a.weight", (hp["q_lora"], H)),
                    ("attn_q_a_norm.weight", (hp["q_lora"],)),
                    ("attn_q_b.weight", (N * (nope + R), hp["q_lora"])),
                    ("attn_kv_a_mqa.weight", (kvl + R, H)),
                    ("attn_kv_a_norm.weight", (kvl,)),
                    ("attn_k_b.weight", (N, kvl, nope)),
                    ("attn_v_b.weight", (N, hp["v_head"], kvl)),
                    ("attn_output.weight", (H, N * hp["v_head"])),
                    ("indexer.attn_q_b.weight",
                     (hp["indexer_heads"] * hp["indexer_dim"], hp["q_lora"])),
                    ("indexer.attn_k.weight", (hp["indexer_dim"], H)),
                    ("indexer.k_norm.weight", (hp["indexer_dim"],)),
                    ("indexer.k_norm.bias", (hp["indexer_dim"],)),
                    ("indexer.proj.weight", (hp["indexer_heads"], H)),
                    ("ffn_norm.weight", (H,))]:
                L[name[:-len(".weight")] if name.endswith(".weight") else name] = \
                    need(p + name, shape)
            if li < hp["leading_dense"]:
                for name in ("ffn_gate", "ffn_up"):
                    L[name] = need(p + name + ".weight")
                    F = L[name].shape[0]
                    need(p + name + ".weight", (F, H))
                L["ffn_down"] = need(p + "ffn_down.weight", (H, L["ffn_gate"].shape[0]))
            else:
                E = hp["experts"]
                L["ffn_gate_inp"] = need(p + "ffn_gate_inp.weight", (E, H))
                L["exp_probs_b"] = t.get(p + "exp_probs_b.bias")  # may be absent
                if L["exp_probs_b"] is not None:
                    need(p + "exp_probs_b.bias", (E,))
                if p + "ffn_gate_up_exps.weight" in t:
                    gu = need(p + "ffn_gate_up_exps.weight")
                    F2 = gu.shape[1]
                    need(p + "ffn_gate_up_exps.weight", (E, F2, H))
                    F = F2 // 2
                    # First F rows of each expert: gate; next F: up.
                    L["ffn_gate_exps"] = gu[:, :F, :]
                    L["ffn_up_exps"] = gu[:, F:, :]
                    self.fused_gate_up = True
                else:
                    L["ffn_gate_exps"] = need(p + "ffn_gate_exps.weight")
                    F = L["ffn_gate_exps"].shape[1]
                    need(p + "ffn_gate_exps.weight", (E, F, H))
                    L["ffn_up_exps"] = need(p + "ffn_up_exps.weight", (E, F, H))
                L["ffn_down_exps"] = need(p + "ffn_down_exps.weight", (E, H, F))
                if hp["shared_experts"] > 0:
                    L["ffn_gate_shexp"] = need(p + "ffn_gate_shexp.weight")
                    Fs = L["ffn_gate_shexp"].shape[0]
                    need(p + "ffn_gate_shexp.weight", (Fs, H))
                    L["ffn_up_shexp"] = need(p + "ffn_up_shexp.weight", (Fs, H))
                    L["ffn_down_shexp"] = need(p + "ffn_down_shexp.weight", (H, Fs))
            self.layers.append(L)

    # -- state ---------------------------------------------------------------

    def reset(self):
        """Empties the caches."""
        hp = self.hp
        self.kv_caches = [_Cache(hp["kv_lora"] + hp["rope_dims"], self.cache_dtype)
                          for _ in range(hp["layers"])]
        self.index_caches = [_Cache(hp["indexer_dim"], self.cache_dtype)
                             for _ in range(hp["layers"])]
        self.last_step = None

    def kv_cache(self, layer):
        """Layer's latent cache as float64 [positions, kv_lora + rope]."""
        return self.kv_caches[layer].read()

    def index_cache(self, layer):
        """Layer's indexer key cache as float64 [positions, indexer_dim]."""
        return self.index_caches[layer].read()

    # -- the step ------------------------------------------------------------

    def step(self, token, position):
        """Runs one decode token at `position` (the caches must hold positions
        0..position-1; later entries are discarded). Returns float64 logits
        [vocab]; the decisions taken are in `self.last_step`."""
        hp = self.hp
        token, position = int(token), int(position)
        if not 0 <= token < hp["vocab"]:
            raise ValueError(f"token {token} outside the vocabulary")
        if position < 0:
            raise ValueError(f"negative position {position}")
        x = self.token_embd[token].astype(np.float64)
        layer_recs = []
        for li, L in enumerate(self.layers):
            rec = {"layer": li}
            a = rms_norm(x, L["attn_norm"], hp["rms_eps"])
            x = x + self._attention(li, a, position, rec)
            f = rms_norm(x, L["ffn_norm"], hp["rms_eps"])
            if li < hp["leading_dense"]:
                x = x + self._swiglu(f, L["ffn_gate"], L["ffn_up"], L["ffn_down"])
            else:
                x = x + self._moe(li, f, rec)
            layer_recs.append(rec)
        logits = self.output @ rms_norm(x, self.output_norm, hp["rms_eps"])
        best, gap = argmax_and_gap(logits)
        self.last_step = self._summarise(position, layer_recs, best, gap)
        return logits

    def _attention(self, li, a, pos, rec):
        hp, L = self.hp, self.layers[li]
        N, nope, R, kvl = hp["heads"], hp["qk_nope"], hp["rope_dims"], hp["kv_lora"]
        theta = hp["rope_theta"]
        c_q = rms_norm(L["attn_q_a"] @ a, L["attn_q_a_norm"], hp["rms_eps"])
        q = (L["attn_q_b"] @ c_q).reshape(N, nope + R)
        q_nope = q[:, :nope]
        q_pe = rope_interleaved(q[:, nope:], pos, theta)  # LAST rope dims
        kv = L["attn_kv_a_mqa"] @ a
        c_kv = rms_norm(kv[:kvl], L["attn_kv_a_norm"], hp["rms_eps"])
        k_pe = rope_interleaved(kv[kvl:], pos, theta)
        self.kv_caches[li].put(pos, np.concatenate([c_kv, k_pe]))

        # DSA indexer: rope on the FIRST rope dims of each head and the key.
        IH, ID = hp["indexer_heads"], hp["indexer_dim"]
        q_i = (L["indexer.attn_q_b"] @ c_q).reshape(IH, ID).copy()
        q_i[:, :R] = rope_interleaved(q_i[:, :R], pos, theta)
        k_i = layer_norm(L["indexer.attn_k"] @ a, L["indexer.k_norm"],
                         L["indexer.k_norm.bias"], INDEXER_KEY_NORM_EPS)
        k_i[:R] = rope_interleaved(k_i[:R], pos, theta)
        self.index_caches[li].put(pos, k_i)
        head_w = L["indexer.proj"] @ a
        scores = self.indexer_scores(li, q_i, head_w)
        top_k = hp["indexer_top_k"]
        sel, gap = top_k_stable(scores, top_k)
        sel = np.sort(sel)
        rec["indexer_query"] = q_i          # roped [indexer_heads, indexer_dim]
        rec["indexer_weights"] = head_w     # proj(a) [indexer_heads]
        rec["indexer_scores"] = scores
        rec["indexer_gap"] = gap
        rec["indexer_zero_tie_margin"] = self._zero_tie_margin(li, q_i, head_w,
                                                               scores, top_k)
        if self.dense_attention:
            sel = np.arange(pos + 1)
        rec["selected"] = sel

        o = self._attend(li, q_nope, q_pe, sel)  # [N, v_head]
        return L["attn_output"] @ o.reshape(-1)

    def indexer_scores(self, li, q_i, head_w):
        """score[t] = sum_h w[h] / sqrt(dim * heads) * relu(q[h] . k[t]) over
        the cached positions (GLM5.md section 6)."""
        hp = self.hp
        scale = 1.0 / math.sqrt(hp["indexer_dim"] * hp["indexer_heads"])
        keys = self.index_cache(li)                      # [T, ID]
        dots = np.maximum(q_i @ keys.T, 0.0)             # [IH, T]
        return (head_w * scale) @ dots                   # [T]

    def _zero_tie_margin(self, li, q_i, head_w, scores, top_k):
        """When the k-th and (k+1)-th indexer scores are both exactly 0 (every
        head's relu is 0 for those tokens, common on tiny models), the tie is
        broken by position and indexer_gap is 0, yet the choice only flips if
        some head's dot for a zero-score token crosses 0. This is that
        distance in score units: min over zero-score tokens t and heads h of
        scale * |w[h]| * |q[h] . k[t]| (inf when there is no such tie)."""
        n = scores.shape[0]
        if top_k >= n:
            return math.inf
        ordered = np.sort(scores)[::-1]
        if not (ordered[top_k - 1] == 0.0 and ordered[top_k] == 0.0):
            return math.inf
        hp = self.hp
        scale = 1.0 / math.sqrt(hp["indexer_dim"] * hp["indexer_heads"])
        zero = np.flatnonzero(scores == 0.0)
        dots = q_i @ self.index_cache(li)[zero].T        # [IH, Z]
        m = scale * np.abs(head_w)[:, None] * np.abs(dots)
        m = m[head_w != 0.0]
        return float(m.min()) if m.size else math.inf

    def _attend(self, li, q_nope, q_pe, sel):
        """Absorbed MLA over the selected cache rows: per-head output [N, v_head]
        after attn_v_b. (Tests override this with the naive form.)"""
        hp, L = self.hp, self.layers[li]
        kvl = hp["kv_lora"]
        cache = self.kv_cache(li)[sel]                   # [S, kvl + R]
        lat, k_pe = cache[:, :kvl], cache[:, kvl:]
        q_lat = np.einsum("hln,hn->hl", L["attn_k_b"], q_nope)   # [N, kvl]
        scale = 1.0 / math.sqrt(hp["qk_nope"] + hp["rope_dims"])
        s = (q_lat @ lat.T + q_pe @ k_pe.T) * scale              # [N, S]
        p = softmax(s, axis=1)
        o_lat = p @ lat                                           # [N, kvl]
        return np.einsum("hvl,hl->hv", L["attn_v_b"], o_lat)      # [N, v]

    @staticmethod
    def _swiglu(f, gate, up, down):
        return down @ (silu(gate @ f) * (up @ f))

    def _moe(self, li, f, rec):
        hp, L = self.hp, self.layers[li]
        logits = L["ffn_gate_inp"] @ f
        p = sigmoid(logits) if hp["gating"] == GATING_SIGMOID else softmax(logits)
        choose = p + L["exp_probs_b"] if L["exp_probs_b"] is not None else p
        ids, gap = top_k_stable(choose, hp["experts_used"])
        w = p[ids]
        if hp["weights_norm"]:
            w = w / max(float(np.sum(w)), ROUTER_SUM_FLOOR)
        w = w * hp["routed_scale"]
        g = np.einsum("kfh,h->kf", L["ffn_gate_exps"][ids], f)
        u = np.einsum("kfh,h->kf", L["ffn_up_exps"][ids], f)
        h = silu(g) * u
        y = np.einsum("khf,kf->kh", L["ffn_down_exps"][ids], h)
        y = w @ y
        if hp["shared_experts"] > 0:
            y = y + self._swiglu(f, L["ffn_gate_shexp"], L["ffn_up_shexp"],
                                 L["ffn_down_shexp"])
        rec["experts"] = ids
        rec["expert_weights"] = w
        rec["router_scores"] = choose
        rec["router_gap"] = gap
        return y

    def _summarise(self, position, layer_recs, best, argmax_gap):
        idx_gaps = [r["indexer_gap"] for r in layer_recs]
        rt_gaps = [r["router_gap"] for r in layer_recs if "router_gap" in r]
        cands = [(argmax_gap, "argmax")]
        cands += [(g, f"layer {r['layer']} indexer") for r, g in zip(layer_recs, idx_gaps)]
        cands += [(r["router_gap"], f"layer {r['layer']} router")
                  for r in layer_recs if "router_gap" in r]
        gmin, where = min(cands, key=lambda c: c[0])
        return {
            "position": position,
            "argmax": best,
            "argmax_gap": argmax_gap,
            "indexer_gap": min(idx_gaps, default=math.inf),
            "router_gap": min(rt_gaps, default=math.inf),
            "indexer_zero_tie_margin": min(
                (r["indexer_zero_tie_margin"] for r in layer_recs), default=math.inf),
            "min_gap": gmin,
            "min_gap_where": where,
            "dropped": any(len(r["selected"]) < position + 1 for r in layer_recs),
            "layers": layer_recs,
        }

    # -- sequences -----------------------------------------------------------

    def _collect(self, steps):
        def arr(key, dtype=np.float64):
            return np.array([s[key] for s in steps], dtype=dtype)
        return {
            "argmax": arr("argmax", np.int64),
            "argmax_gap": arr("argmax_gap"),
            "indexer_gap": arr("indexer_gap"),
            "router_gap": arr("router_gap"),
            "indexer_zero_tie_margin": arr("indexer_zero_tie_margin"),
            "min_gap": arr("min_gap"),
            "min_gap_where": [s["min_gap_where"] for s in steps],
            "dropped": arr("dropped", bool),
            "selected": [[r["selected"] for r in s["layers"]] for s in steps],
            "experts": [{r["layer"]: r["experts"] for r in s["layers"] if "experts" in r}
                        for s in steps],
            "steps": steps,
        }

    def run(self, tokens):
        """Teacher forcing from an empty cache: tokens[i] at position i.
        Returns (logits float64 [n, vocab], info), info per position i:
          argmax[i]       greedy next token (ties to the lowest id)
          argmax_gap[i]   top-1 minus top-2 logit
          indexer_gap[i]  min over layers of the k-th minus (k+1)-th indexer
                          score (inf where no token was dropped)
          indexer_zero_tie_margin[i]  where that gap is an exact tie of two
                          zero scores: how far a head's dot is from crossing 0,
                          in score units (inf elsewhere); see _zero_tie_margin
          router_gap[i]   min over MoE layers of the k-th minus (k+1)-th
                          selection score (p + exp_probs_b)
          min_gap[i]      min of argmax_gap, indexer_gap and router_gap
          min_gap_where[i]  which decision that is ("layer 2 router", ...)
          dropped[i]      whether any layer's indexer dropped a token
          selected[i][l]  positions layer l attended to (ascending)
          experts[i][l]   expert ids chosen in MoE layer l
          steps[i]        the full record (per layer: indexer query, weights,
                          scores, router scores, expert weights, ...)"""
        self.reset()
        logits, steps = [], []
        for i, tok in enumerate(tokens):
            logits.append(self.step(tok, i))
            steps.append(self.last_step)
        out = np.stack(logits) if logits else np.zeros((0, self.hp["vocab"]))
        return out, self._collect(steps)

    def generate(self, prompt, n, return_info=False):
        """Greedy (argmax, ties to the lowest id) continuation of `prompt` from
        an empty cache: the n new tokens (and, with return_info, the info of
        every step run, as run() gives it)."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("generate needs a non-empty prompt")
        self.reset()
        steps, out = [], []
        tok, pos = None, 0
        for tok in prompt:
            self.step(tok, pos)
            steps.append(self.last_step)
            pos += 1
        while len(out) < n:
            nxt = steps[-1]["argmax"]
            out.append(nxt)
            if len(out) == n:
                break
            self.step(nxt, pos)
            steps.append(self.last_step)
            pos += 1
        return (out, self._collect(steps)) if return_info else out


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True,
                    help="comma-separated token ids, fed at positions 0, 1, ...")
    ap.add_argument("--cache-dtype", choices=["f16", "f32", "f64"], default="f16")
    ap.add_argument("--logits-out", help="write the logits [n, vocab] as .npy")
    ap.add_argument("--generate", type=int, default=0,
                    help="also print N greedy tokens after the prompt")
    ap.add_argument("--dense", action="store_true",
                    help="ignore the indexer's selection (dense attention)")
    ap.add_argument("--top-k", type=int, help="override the indexer top-k")
    args = ap.parse_args(argv)
    dtype = {"f16": np.float16, "f32": np.float32, "f64": np.float64}[args.cache_dtype]
    tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    ref = GLM5Reference(args.model, cache_dtype=dtype, dense_attention=args.dense,
                        indexer_top_k=args.top_k)
    logits, info = ref.run(tokens)
    print("pos token argmax  argmax_gap  indexer_gap  router_gap     min_gap"
          "  zero_tie_margin  (where)")
    for i, tok in enumerate(tokens):
        print(f"{i:3d} {tok:5d} {info['argmax'][i]:6d} {info['argmax_gap'][i]:11.4e}"
              f" {info['indexer_gap'][i]:12.4e} {info['router_gap'][i]:11.4e}"
              f" {info['min_gap'][i]:11.4e} {info['indexer_zero_tie_margin'][i]:16.4e}"
              f"  ({info['min_gap_where'][i]})")
    if args.logits_out:
        np.save(args.logits_out, logits)
    if args.generate:
        print("generated:", ",".join(map(str, ref.generate(tokens, args.generate))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
