"""Job specs: what a rollout job asks for, validated at the boundary."""
