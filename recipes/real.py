# Every config that is not tiny (v2w-2b, v2w-14b, p25-2b, ...): upstream's clip and schedule, the real Wan VAE
# (--vae-ckpt), an explicit --init and --data.
vae = "real"
frames, height, width = 93, 432, 768
steps, lr, warmup = 20000, 2 ** -14.5, 1000
save_every, sample_every = 200, 1000
