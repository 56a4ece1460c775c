"""A GAN's step: the discriminator on a real batch first, then the generator on noise the loop makes, the
discriminator on its output, and both optimizers (pytorch/examples' dcgan)."""
import torch
import torch.nn as nn

torch.manual_seed(0)
nz = 4
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
netG = nn.Sequential(nn.Linear(nz, 8), nn.ReLU(), nn.Linear(8, 6)).to(device)
netD = nn.Sequential(nn.Linear(6, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1), nn.Sigmoid()).to(device)
criterion = nn.BCELoss()
optD = torch.optim.Adam(netD.parameters(), lr=1e-3)
optG = torch.optim.Adam(netG.parameters(), lr=1e-3)
data = [torch.randn(4, 6) for _ in range(3)]

for real in data:
    netD.zero_grad()
    real = real.to(device)
    label = torch.full((real.size(0),), 1.0, device=device)
    errD_real = criterion(netD(real).view(-1), label)
    errD_real.backward()
    noise = torch.randn(real.size(0), nz, device=device)
    fake = netG(noise)
    label.fill_(0.0)
    errD_fake = criterion(netD(fake.detach()).view(-1), label)
    errD_fake.backward()
    optD.step()
    netG.zero_grad()
    label.fill_(1.0)
    errG = criterion(netD(fake).view(-1), label)
    errG.backward()
    optG.step()
print(f"loss D {errD_real.item() + errD_fake.item():.3f} G {errG.item():.3f}")
