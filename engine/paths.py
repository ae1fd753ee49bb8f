"""Where specchat keeps its files: the user's config, data and cache directories.

Each directory comes from :mod:`platformdirs` for the app name ``specchat`` and
can be moved with an environment variable (tests point all three at temporary
directories). Nothing in the engine writes anywhere else.

=====================  ======================  ======================================
function               override                holds
=====================  ======================  ======================================
:func:`config_dir`     ``SPECCHAT_CONFIG_DIR``  ``models.toml`` with the user's profiles
:func:`data_dir`       ``SPECCHAT_DATA_DIR``    history and other state worth keeping
:func:`cache_dir`      ``SPECCHAT_CACHE_DIR``   downloaded wheels, extracted and converted models
:func:`state_dir`      ``SPECCHAT_STATE_DIR``   small state between runs (the last profile used)
=====================  ======================  ======================================
"""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "specchat"


def _dir(env_var: str, default: str, create: bool) -> Path:
    override = os.environ.get(env_var)
    path = Path(override).expanduser() if override else Path(default)
    path = path.absolute()
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def config_dir(create: bool = False) -> Path:
    """The user's config directory (``SPECCHAT_CONFIG_DIR`` overrides it)."""
    return _dir("SPECCHAT_CONFIG_DIR", platformdirs.user_config_dir(APP_NAME, appauthor=False), create)


def data_dir(create: bool = False) -> Path:
    """The user's data directory (``SPECCHAT_DATA_DIR`` overrides it)."""
    return _dir("SPECCHAT_DATA_DIR", platformdirs.user_data_dir(APP_NAME, appauthor=False), create)


def cache_dir(create: bool = False) -> Path:
    """The cache directory for downloads and converted models (``SPECCHAT_CACHE_DIR`` overrides it)."""
    return _dir("SPECCHAT_CACHE_DIR", platformdirs.user_cache_dir(APP_NAME, appauthor=False), create)


def state_dir(create: bool = False) -> Path:
    """The user's state directory (``SPECCHAT_STATE_DIR`` overrides it)."""
    return _dir("SPECCHAT_STATE_DIR", platformdirs.user_state_dir(APP_NAME, appauthor=False), create)
