"""Running pytgi on cluster engines: `ray_serve` (Ray Serve deployments of `pytgi serve`)."""
