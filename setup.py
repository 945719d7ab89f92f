"""Ships the shim's Scala sources inside the package, so an installed arrowstate can build
its jar against whatever Spark it finds (`python -m arrowstate build`)."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithShimSources(build_py):
    def run(self):
        super().run()
        src = Path(__file__).parent / "jvm-shim" / "src" / "main" / "scala"
        dest = Path(self.build_lib) / "arrowstate" / "shim_src"
        if src.is_dir():
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(src, dest)


setup(cmdclass={"build_py": BuildPyWithShimSources})
