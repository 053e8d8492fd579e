"""auto_complete_config sets max_batch_size 8 below the configured 32, which auto-complete must refuse."""


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.set_max_batch_size(8)
        return auto_complete_model_config

    def execute(self, requests):
        return []
