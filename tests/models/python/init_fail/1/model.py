"""initialize() raises: the model must be UNAVAILABLE with this message in the repository index."""


class TritonPythonModel:
    def initialize(self, args):
        raise ValueError("initialize exploded on purpose")

    def execute(self, requests):
        return []
