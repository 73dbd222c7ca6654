"""What-if replay: recorded provider behaviour fed to another policy's core on virtual time."""
