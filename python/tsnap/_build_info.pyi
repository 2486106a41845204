# Types of _build_info.py, which the build generates (python/build_info.py.in).
TORCH_VERSION: str
TSNAP_VERSION: str
