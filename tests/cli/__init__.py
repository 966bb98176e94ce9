"""The command-line tools run as processes: groupctl's commands, coordinatord's command line, bad input, structured logs."""
