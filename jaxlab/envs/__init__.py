"""Multi-turn environments for agents: the protocol (`base`) and the gyms (`function`)."""
