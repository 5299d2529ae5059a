"""Route handlers, one module per resource. Each declares its permission in opt["perm"]."""
