"""The live 3D view in the browser (viser): no ROS; the node and the tools call it."""
