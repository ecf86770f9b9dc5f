"""What goes back to the client: the chunk model both fronts render, the filter, tool calls."""
