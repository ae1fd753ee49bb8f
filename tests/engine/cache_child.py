"""Run by test_cache's kill -9 tests: a download through a hanging fake pip, or an
extraction slowed down so it can be killed half way."""
from __future__ import annotations

import sys
import time
import zipfile

import engine.fetch.cachefiles as cachefiles
import engine.fetch.wheels as wheels

if sys.argv[1] == "download":
    real = cachefiles.die_with_parent_argv
    wheels.die_with_parent_argv = lambda module, *args: real("tests.engine.fake_pip", *args)  # type: ignore[assignment]
else:
    read = zipfile.ZipExtFile.read

    def slow_read(self, n=-1):  # type: ignore[no-untyped-def]
        time.sleep(0.2)
        return read(self, n)

    zipfile.ZipExtFile.read = slow_read  # type: ignore[method-assign]
wheels.fetch_wheel_file(sys.argv[2])
