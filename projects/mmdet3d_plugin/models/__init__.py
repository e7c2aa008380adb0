"""Registered model components: detectors, heads, transformer, AQR, backbones, necks."""
from . import aqr, backbones, dense_heads, detectors, necks, utils  # noqa: F401
