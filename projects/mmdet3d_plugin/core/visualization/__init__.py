"""Pictures of a detector's boxes and of AQR's routing (tools/visualize_aqr.py).

Pure functions of arrays (numpy / torch), drawn with matplotlib's Agg
canvas (no pyplot, no display). Not imported by the plugin's ``__init__``,
so importing the plugin does not import matplotlib.
"""
from .bev_plot import plot_bev
from .bias_maps import query_bias_row, split_key_bias
from .bias_plot import plot_query_bias
from .camera_plot import plot_cameras
from .figures import save_figure
from .images import camera_names, denormalize_image
from .query_geometry import query_centres, query_pixels

__all__ = [
    'plot_bev', 'query_bias_row', 'split_key_bias', 'plot_query_bias', 'plot_cameras', 'save_figure', 'camera_names',
    'denormalize_image', 'query_centres', 'query_pixels'
]
