"""fallgate inside other software's agents: hermes-agent (`hermes.attach`)."""
