from pathlib import Path

pytest_plugins = [
    "tests.fixtures.parallel",
    "tests.fixtures.databases",
    "tests.fixtures.api",
    "tests.fixtures.control_plane",
]
if (Path(__file__).parent / "fixtures" / "ray_cluster.py").exists():
    pytest_plugins.append("tests.fixtures.ray_cluster")
