"""Nereid on a Ray cluster (`nereid ray serve`): model replicas as a Ray Serve deployment multiplexed by model name,
and Nereid's own frontends as the ingress on every node. It sits above the server and never imports Ray at import
time of the rest of Nereid: only `nereid ray ...` and the code here need the `ray` extra."""

__all__: list[str] = []
