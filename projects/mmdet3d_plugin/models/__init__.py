"""Registered model components: detectors, heads, transformer, AQR, backbones, necks, middle encoders."""
from . import aqr, backbones, dense_heads, detectors, middle_encoders, necks, utils  # noqa: F401
