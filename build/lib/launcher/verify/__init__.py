"""Judging a run from its tmux pane.

parse.py (pane text -> samples) and formats.py (other trainers' lines) read; checks.py judges
samples and pane state (pure); prober.py is the startup-probe loop; poll.py is one poll round
trip; workflows.py runs verify, status and smoke on a target; report.py renders the result.
"""
