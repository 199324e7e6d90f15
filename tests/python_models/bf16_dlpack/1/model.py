"""BF16 as Triton's python models read and write it: through torch's DLPack (numpy has no
BF16). OUTPUT0 is INPUT0 doubled."""

import torch
import triton_python_backend_utils as pb_utils
from torch.utils.dlpack import from_dlpack, to_dlpack


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = from_dlpack(pb_utils.get_input_tensor_by_name(request, "INPUT0").to_dlpack())
            assert data.dtype == torch.bfloat16
            doubled = pb_utils.Tensor.from_dlpack("OUTPUT0", to_dlpack(data * 2))
            responses.append(pb_utils.InferenceResponse([doubled]))
        return responses
