"""Load generator (`marconi-loadgen`): replays real conversations and agent trajectories
against any OpenAI-compatible endpoint (issue "Load generator and the end-to-end
comparison")."""
