"""Streaming LingBot-Map reconstruction for ROS 2."""
import pkgutil

# The generated interfaces (lingbot_ros.msg, lingbot_ros.srv) are installed into site-packages by
# colcon or scripts/build_interfaces.sh. When this package is imported from a source checkout
# (tests, development), extend_path lets those subpackages be found next to the sources.
__path__ = pkgutil.extend_path(__path__, __name__)

__version__ = "0.1.0"
