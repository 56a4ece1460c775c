"""An LSTM language model in word_language_model's shape: the hidden state comes from init_hidden."""
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class RNNModel(nn.Module):
    def __init__(self, ntoken=50, nhid=16, nlayers=1):
        super().__init__()
        self.nlayers, self.nhid = nlayers, nhid
        self.encoder = nn.Embedding(ntoken, nhid)
        self.rnn = nn.LSTM(nhid, nhid, nlayers)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, input, hidden):
        output, hidden = self.rnn(self.encoder(input), hidden)
        return self.decoder(output).view(-1, self.decoder.out_features), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


torch.manual_seed(0)
data = torch.randint(0, 50, (41, 4)).to(device)
model = RNNModel().to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.5)
hidden = model.init_hidden(4)
for i in range(0, 40, 8):
    inp, target = data[i:i + 8], data[i + 1:i + 9].reshape(-1)
    hidden = tuple(h.detach() for h in hidden)
    opt.zero_grad()
    output, hidden = model(inp, hidden)
    loss = nn.functional.cross_entropy(output, target)
    loss.backward()
    opt.step()
print("loss", float(loss))
