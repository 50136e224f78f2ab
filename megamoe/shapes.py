"""MoE layer shapes and the presets users ask for by name.

Presets (source: DeepGEMM ``tests/test_mega_moe.py`` defaults and DeepGEMM PR #316's
benchmark table):

==================  =======  =====  ======  ============
preset              experts  top-k  hidden  intermediate
==================  =======  =====  ======  ============
deepseek-v4-pro     384      6      7168    3072
deepseek-v4-flash   256      6      4096    2048
==================  =======  =====  ======  ============

A custom shape is written ``E,k,H,I`` (for example ``64,4,1024,512``) or built with
:class:`MoEShape` directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InputError, parse_int, require


@dataclass(frozen=True)
class MoEShape:
    """Shape of one MoE layer.

    Attributes:
        name: preset name or ``"custom"``.
        num_experts: routed experts in the layer (all ranks together).
        top_k: experts chosen per token.
        hidden: model dimension H (L1 K, L2 N); multiple of 128.
        intermediate: expert FFN dimension I (L1 N is 2*I, L2 K is I); multiple of 128.

    Raises:
        InputError: top_k > num_experts, non-positive fields, or hidden / intermediate not
            a multiple of 128 (the UE8M0 scale packing of 4 x 32 elements needs it).
    """

    name: str
    num_experts: int
    top_k: int
    hidden: int
    intermediate: int

    def __post_init__(self) -> None:
        for f in ("num_experts", "top_k", "hidden", "intermediate"):
            v = getattr(self, f)
            require(isinstance(v, int) and not isinstance(v, bool) and v > 0,
                    f"shape.{f}", "a positive integer", v)
        require(self.top_k <= self.num_experts, "shape.top_k",
                f"<= num_experts ({self.num_experts})", self.top_k)
        require(self.top_k <= 32, "shape.top_k", "<= 32 (one dispatch lane per slot)", self.top_k)
        require(self.hidden % 128 == 0, "shape.hidden", "a multiple of 128", self.hidden)
        require(self.intermediate % 128 == 0, "shape.intermediate", "a multiple of 128",
                self.intermediate)

    @property
    def flops_per_routed_token(self) -> int:
        """FLOPs of one (token, slot) through L1 and L2: ``2 * 3 * H * I``."""
        return 6 * self.hidden * self.intermediate


PRESETS: dict[str, MoEShape] = {
    "deepseek-v4-pro": MoEShape("deepseek-v4-pro", 384, 6, 7168, 3072),
    "deepseek-v4-flash": MoEShape("deepseek-v4-flash", 256, 6, 4096, 2048),
}


def get_shape(spec: str | MoEShape) -> MoEShape:
    """Resolve a preset name or an ``E,k,H,I`` string into a :class:`MoEShape`.

    Raises:
        InputError: unknown preset, malformed custom spec, or a spec that is neither a string
            nor a :class:`MoEShape`.
    """
    if isinstance(spec, MoEShape):
        return spec
    if not isinstance(spec, str):
        raise InputError("shape", f"one of {', '.join(sorted(PRESETS))} or an E,k,H,I string", repr(spec))
    if spec.lower() in PRESETS:
        return PRESETS[spec.lower()]
    parts = spec.split(",")
    if len(parts) == 4:
        try:
            e, k, h, i = (parse_int(p) for p in parts)
        except ValueError:
            raise InputError("shape", f"one of {', '.join(sorted(PRESETS))} or four integers E,k,H,I", spec) from None
        return MoEShape("custom", e, k, h, i)
    raise InputError("shape", f"one of {', '.join(sorted(PRESETS))} or four integers E,k,H,I", spec)
