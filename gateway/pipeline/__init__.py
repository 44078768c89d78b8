"""The data path of one relayed request, top to bottom: admission, cache, router, delivery."""
