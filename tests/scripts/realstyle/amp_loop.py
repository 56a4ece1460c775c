"""The AMP recipe of the PyTorch docs (autocast + GradScaler) around an embedding LM head; --scaler
enables the GradScaler the recipe builds with enabled=False here, --pure-half trains model.half() instead."""
import argparse, torch, torch.nn as nn
p = argparse.ArgumentParser(); p.add_argument("--scaler", action="store_true"); p.add_argument("--pure-half", action="store_true")
args = p.parse_args()
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 50)).to(device)
if args.pure_half:
    model.half()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler(device.type, enabled=args.scaler)
for step in range(2):
    x = torch.randint(0, 50, (4, 8), device=device)
    with torch.autocast(device.type, dtype=torch.float16, enabled=not args.pure_half):
        logits = model(x)
    loss = nn.functional.cross_entropy(logits.float().view(-1, 50), x.view(-1))
    scaler.scale(loss).backward()
    scaler.step(opt); scaler.update(); opt.zero_grad()
    print("step", step, loss.item(), torch.isnan(model[0].weight).any().item())
