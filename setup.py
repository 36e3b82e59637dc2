"""Everything about the package is in pyproject.toml; this file only adds `kiln-launch.pth` to site-packages.

`kiln-launch.pth` makes `accelerate launch` of a Kiln command forward SIGTERM/SIGINT to the training process and
exit with its status (see kiln/launcher.py). A .pth file must sit at the top of site-packages, which
pyproject.toml cannot express: build_py puts it at the top of the wheel (regular installs) and, for
`pip install -e .`, at the top of the editable wheel."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "kiln-launch.pth"


class build_py_with_pth(build_py):
    def run(self):
        super().run()
        here = os.path.dirname(os.path.abspath(__file__))
        targets = [self.build_lib]
        if getattr(self, "editable_mode", False):  # the editable wheel is made from install_lib, not build_lib
            targets.append(self.get_finalized_command("install").install_lib)
        for target in targets:
            os.makedirs(target, exist_ok=True)
            self.copy_file(os.path.join(here, PTH), os.path.join(target, PTH))

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": build_py_with_pth})
