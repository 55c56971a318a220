"""worldstep: drive an action-conditioned video world model like a simulator."""
