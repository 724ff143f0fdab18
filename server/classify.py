"""POST /classify (vLLM's, also /v1/classify): each input — a string, or token ids — classified by
the served sequence classifier (a *ForSequenceClassification model: ModelConfig's
classifier_labels): a PoolingParams request of task "classify", whose prompt's last row times the
model's score matrix gives the label logits, then their softmax (worker/pooler.py). Per input the
probabilities in label-id order, the most probable label's name and the number of classes;
`use_activation: false` (vLLM's older `activation`) returns the logits instead. A model that is not
a classifier answers 400."""

from __future__ import annotations

from aiohttp import web

from corellm.pooling_params import PoolingParams
from corellm.server.embeddings import PooledInputsRequest, embed
from corellm.server.errors import bad_request
from corellm.server.serving import Serving, now


class ClassificationRequest(PooledInputsRequest):
    use_activation: bool | None = None  # vLLM's; default true: probabilities
    activation: bool | None = None  # vLLM's older name of use_activation

    def activation_on(self) -> bool:
        if self.use_activation is not None and self.activation is not None and self.use_activation != self.activation:
            raise bad_request("use_activation and activation (its older name) disagree: give one", "activation")
        return self.use_activation is not False and self.activation is not False


async def create_classification(serving: Serving, request: web.Request, req: ClassificationRequest) -> web.Response:
    model, lora = serving.resolve_model(req.model)
    labels = serving.classifier_labels
    if not labels:
        raise bad_request(f"the model {model} is not a sequence classifier (a *ForSequenceClassification model): it "
                          f"has no labels to classify into", "model", "model_not_supported")
    response_id, engine_id = serving.new_ids("classify-", request, req.request_id)
    params = PoolingParams(task="classify", use_activation=req.activation_on())
    rows, tokens = await embed(serving, engine_id, req.prompts(), params, add_special_tokens=req.add_special_tokens,
                               truncate_prompt_tokens=req.truncate_prompt_tokens,
                               truncation_side=req.truncation_side, priority=req.priority, lora_request=lora)
    data = [{"index": i, "label": labels[max(range(len(probs)), key=probs.__getitem__)], "probs": probs,
             "num_classes": len(probs)} for i, probs in enumerate(rows)]
    return web.json_response({"id": response_id, "object": "list", "created": now(), "model": model, "data": data,
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}})
