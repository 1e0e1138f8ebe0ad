"""`launcher watch`: judge runs for their whole life, notify on transitions, restart by policy."""
