"""ament_python build of lingbot_ros; also a plain pip-installable package (``pip install .``)."""
from glob import glob

from setuptools import find_packages, setup

package_name = "lingbot_ros"

# The pinned ROS 2 wheels of one distro each, as in requirements-ros.txt (Kilted, the venv set-up's
# default) and requirements-ros-jazzy.txt (test/test_project_packaging.py keeps them equal).
ros_kilted = [
    "ros-kilted-rclpy[fastrtps]==9.1.2",
    "ros-kilted-std-msgs==5.5.1",
    "ros-kilted-sensor-msgs==5.5.1",
    "ros-kilted-geometry-msgs==5.5.1",
    "ros-kilted-nav-msgs==5.5.1",
    "ros-kilted-diagnostic-msgs==5.5.1",
    "ros-kilted-std-srvs==5.5.1",
    "ros-kilted-rosgraph-msgs==2.3.0",
]
ros_jazzy = [
    "ros-jazzy-rclpy[fastrtps]==7.1.6",
    "ros-jazzy-std-msgs==5.3.6",
    "ros-jazzy-sensor-msgs==5.3.6",
    "ros-jazzy-geometry-msgs==5.3.6",
    "ros-jazzy-nav-msgs==5.3.6",
    "ros-jazzy-diagnostic-msgs==5.3.6",
    "ros-jazzy-std-srvs==5.3.6",
    "ros-jazzy-rosgraph-msgs==2.0.3",
]

setup(
    name=package_name,
    version="0.1.0",
    packages=find_packages(include=[package_name, package_name + ".*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", ["resource/" + package_name]),
        ("share/" + package_name, ["package.xml"]),
        ("share/" + package_name + "/launch", glob("launch/*.py")),
        ("share/" + package_name + "/config", glob("config/*")),
        ("share/" + package_name + "/rviz", glob("rviz/*")),
        ("share/" + package_name + "/msg", glob("msg/*.msg")),
        ("share/" + package_name + "/srv", glob("srv/*.srv")),
        # launch_ros looks for executables in <prefix>/lib/<package>, pip puts scripts in bin/.
        ("lib/" + package_name, glob("libexec/*")),
    ],
    python_requires=">=3.10",
    # torch is deliberately not pinned: users bring the build that matches their CUDA.
    install_requires=["numpy", "pillow", "opencv-python-headless", "simplejpeg", "rosbags", "tqdm",
                      "torch>=2.4"],
    extras_require={
        "ros": ros_kilted,
        "ros-jazzy": ros_jazzy,
        "gpu": ["flashinfer-python==0.7.4"],
        # the live 3D view in the browser (viewer_port, --viewer, lingbot-ros-map view)
        "viewer": ["viser==1.1.1"],
        # the benchmarks' plots (bench/)
        "bench": ["matplotlib==3.11.2"],
        "test": ["pytest", "pytest-timeout", "hypothesis"],
    },
    zip_safe=True,
    maintainer="lingbot_ros developers",
    maintainer_email="lingbot-ros@example.com",
    description="Streaming LingBot-Map 3D reconstruction as a ROS 2 node.",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "lingbot-ros-offline = lingbot_ros.tools.offline:main",
            "lingbot-ros-fixture = lingbot_ros.tools.fixture:main",
            "lingbot-ros-node = lingbot_ros.ros.main:main",
            "lingbot-ros-replay = lingbot_ros.tools.replay:main",
            "lingbot-ros-camera = lingbot_ros.tools.camera:main",
            "lingbot-ros-demo = lingbot_ros.tools.run_demo:main",
            "lingbot-ros-prebuild = lingbot_ros.tools.prebuild:main",
            "lingbot-ros-map = lingbot_ros.tools.map_db:main",
        ],
    },
)
