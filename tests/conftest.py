from pathlib import Path

pytest_plugins = [
    "tests.fixtures.parallel",
    "tests.fixtures.cpu_time",  # CPU seconds per test file, child processes included
    "tests.fixtures.databases",
    "tests.fixtures.api",
    "tests.fixtures.control_plane",
    "tests.fixtures.seaweedfs",  # a real S3 server (storage tests)
]
if (Path(__file__).parent / "fixtures" / "ray_cluster.py").exists():
    pytest_plugins.append("tests.fixtures.ray_cluster")
