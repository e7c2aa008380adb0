"""What every other folder of the plugin builds on; it imports none of them.

``host_data``: host data on a device without a host synchronisation
(:func:`~.host_data.host_to_device`, :func:`~.host_data.device_constant`,
:func:`~.host_data.permitted_host_sync`, :class:`~.host_data.HostCopyCounter`).
``repo_paths``: the checkout's root; ``local_resources``: this machine's usable cores and a free port.
"""
