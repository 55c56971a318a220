"""The bounds the warm decoder's frames keep against a reference, each measured and tested (docs/exactness.md)."""

# A warm session vs one `vae.decode` of the whole clip, in [-1, 1] pixels: only `post_quant_conv`'s call
# shape differs (per latent vs whole clip), so they agree within float32 rounding. Measured max 3.8e-6 on
# the test VAEs over seeds, window patterns and CPU kernel selections (docs/exactness.md).
WHOLE_CLIP_DECODE_ATOL = 1e-5
# The fused path (`DecoderOptions.fused`: padding inside the conv, RMS norm + SiLU compiled, statistics in float32)
# vs one whole-clip `vae.decode` in float32, in [-1, 1] pixels: other summation orders in every norm and conv.
# Measured max 2.6e-6 on the test VAEs over seeds, window patterns, torch and oneDNN convs, channels-last on and
# off (tests/test_vae_fused.py; docs/exactness.md); bound kept at the CPU fast path's 1e-4.
FUSED_DECODE_ATOL = 1e-4
# A bfloat16 warm decode (`DecoderOptions.dtype`, the CUDA default) vs the float32 one, same latents, over a long
# stream: every frame within this PSNR (peak-to-peak 2) and max |diff| in [-1, 1] pixels. Measured over 32 latents
# with `tools/decode_dtype_bound.py`: worst 61.6 dB / 0.018 on the trained pusher VAE, 53.1 dB / 0.021 on a VAE of
# Edge's proportions, per-window PSNR flat from the first window to the last (docs/exactness.md).
BF16_DECODE_PSNR_DB = 48.0
BF16_DECODE_ATOL = 0.05
