"""Everything is in pyproject.toml, but for one file: abicache-dropin.pth, put
at the top of site-packages, where Python runs it at start-up (ABICACHE_DROPIN,
see src/abicache/dropin.py), by a wheel and by an editable install alike."""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "abicache-dropin.pth"


class BuildWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(os.path.join("src", PTH), os.path.join(self.build_lib, PTH), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


class EditableWithPth(editable_wheel):
    """`pip install -e .` (the README's install): an editable wheel holds only a path to src/,
    and the drop-in did nothing there. Everything in the unpacked wheel folder goes into the
    wheel (editable_wheel._create_wheel_file), so the .pth is put there; tests/test_dropin.py
    checks an editable install routes torch code, so a setuptools that stops calling this fails
    the suite, not the user."""

    def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):  # type: ignore[no-untyped-def]
        found = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
        shutil.copyfile(os.path.join("src", PTH), os.path.join(unpacked_wheel, PTH))
        return found


setup(cmdclass={"build_py": BuildWithPth, "editable_wheel": EditableWithPth})
