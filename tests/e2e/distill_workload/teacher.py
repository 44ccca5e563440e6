"""Train the teacher; its last checkpoint is what the student's spec names (trial:ID)."""

import torch
from nets import accuracy, data, teacher

import trainhub

torch.manual_seed(0)
ctx = trainhub.init()
x, y = data()
model = teacher()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
for _step in range(150):
    loss = torch.nn.functional.cross_entropy(model(x[:768]), y[:768])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
ctx.report(step=0, val_accuracy=accuracy(model, x[768:], y[768:]))
ctx.save_checkpoint({"model": model.state_dict()}, step=0)
ctx.close()
