"""DCT's codecs, one module each: DCT-DP's threshold codec for DDP's gradient buckets (`dp_threshold`, its C part
`dp_threshold_native`) and DCT-MP's two codecs for the pooled-embedding all-to-all (`mp_topk`: scopes `table` and
`rank`; `mp_sign`: scopes `sign` and `sign2`, its C part `mp_sign_native`), with what they share on the wire
(`wire`). Training and the comm-cost measurements both send through these."""
