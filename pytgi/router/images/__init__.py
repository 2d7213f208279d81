"""Images in requests, in the API process: TGI's `![](url)` markdown found in a prompt, fetched or
decoded within bounds (`sources`, `fetch`, `decode`), run through the model's own image
processor (`processors`), and turned into the placeholder tokens and `MultimodalInput`s the
engine merges image embeddings at (`pipeline`). Nothing here runs a model."""
