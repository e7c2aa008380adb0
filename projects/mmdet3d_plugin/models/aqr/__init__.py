"""AQR (Adaptive Query Routing): query projection, routing weights, attention bias, and the legacy modules."""
from .bias_generator import AttentionBiasGenerator, weights_to_bias
from .feature_modulator import FeatureModulator
from .projection import project_reference_points
from .weight_generator import AQRWeightGenerator
from .weight_renderer import WeightRenderer

__all__ = [
    'AQRWeightGenerator', 'AttentionBiasGenerator', 'FeatureModulator', 'WeightRenderer', 'project_reference_points',
    'weights_to_bias'
]
