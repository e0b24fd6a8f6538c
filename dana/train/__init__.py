"""What the simulator and the distributed runtime share."""
