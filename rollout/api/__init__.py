"""The gRPC edge: generated messages, the servicer, the server. A thin adapter over rollout.service."""
