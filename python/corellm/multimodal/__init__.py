"""Image inputs: decoding and limits (image_loader), preprocessing (image_processor), and what a
request carries per image (features: pixel values, placeholder range, content hash)."""
