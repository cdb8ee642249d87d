import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
B,T,H,KV,D=4,1024,8,4,64
q=torch.randn(B,H,T,D,device='cuda',dtype=torch.bfloat16)
k=torch.randn(B,KV,T,D,device='cuda',dtype=torch.bfloat16)
v=torch.randn(B,KV,T,D,device='cuda',dtype=torch.bfloat16)
for causal in [False, True]:
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(3):
            o=torch.nn.functional.scaled_dot_product_attention(q,k,v,is_causal=causal,enable_gqa=True)
torch.cuda.synchronize()
