"""Image decoding and frame sources, no ROS import (ros/ and tools/ both build on it).

image_codec: sensor_msgs Image / CompressedImage payloads <-> uint8 RGB (raw_image,
compressed_image, orientation, decode_errors underneath). sources: folder, video, rosbag2,
camera and synthetic frame sources, decoding through image_codec.
"""
