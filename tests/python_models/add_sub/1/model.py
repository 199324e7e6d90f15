"""The classic python-backend example: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.sum_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUTPUT0")["data_type"]
        )
        self.diff_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUTPUT1")["data_type"]
        )
        pb_utils.Logger.log_info(f"add_sub initialized as {args['model_instance_name']}")
        pb_utils.Logger.log_verbose(f"add_sub's folder: {pb_utils.get_model_dir()}")

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            total = pb_utils.Tensor("OUTPUT0", (a + b).astype(self.sum_dtype))
            difference = pb_utils.Tensor("OUTPUT1", (a - b).astype(self.diff_dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[total, difference]))
        return responses

    def finalize(self):
        print("add_sub: cleaning up")
